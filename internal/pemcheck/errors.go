package pemcheck

import (
	"errors"
	"fmt"
)

// Sentinel errors, so callers can tell problems apart with errors.Is
// without parsing messages.
var (
	ErrNoBlock     = errors.New("no PEM block")
	ErrNotPEM      = errors.New("non-PEM data")
	ErrSkipped     = errors.New("key kube-apiserver does not load")
	ErrInvisible   = errors.New("block that PEM readers such as kube-apiserver skip")
	ErrMalformed   = errors.New("malformed PEM block")
	ErrUnknownType = errors.New("unknown PEM block type")
	ErrEncrypted   = errors.New("encrypted private keys are not supported")
	ErrParse       = errors.New("cannot parse block")
	ErrNoKey       = errors.New("no key or certificate")
	ErrMissingKind = errors.New("required kind missing")
	ErrKind        = errors.New("kind not allowed here")
	ErrPrivateKey  = errors.New("private key where only public material is allowed")
	ErrExpired     = errors.New("certificate expired")
	ErrNotYetValid = errors.New("certificate not yet valid")
	ErrMismatch    = errors.New("certificate does not match private key")
	ErrUnsupported = errors.New("unsupported key")
)

// Error locates a problem in a PEM file. Its message never carries key
// material: only the file name, the block's position and PEM type, and a
// reason.
type Error struct {
	File  string
	Block int    // 1-based block number; 0 when the problem is not one block's
	Line  int    // 1-based line; 0 when unknown
	Type  string // PEM type of the block, if any
	Err   error
}

func (e *Error) Error() string {
	switch {
	case e.Block > 0:
		return fmt.Sprintf("%s: block %d (line %d, %s): %v", e.File, e.Block, e.Line, e.Type, e.Err)
	case e.Line > 0:
		return fmt.Sprintf("%s: line %d: %v", e.File, e.Line, e.Err)
	default:
		return fmt.Sprintf("%s: %v", e.File, e.Err)
	}
}

func (e *Error) Unwrap() error { return e.Err }

// BlockError is err located at block b of file.
func BlockError(file string, b *Block, err error) error {
	return &Error{File: file, Block: b.Index, Line: b.Line, Type: b.Type, Err: err}
}
