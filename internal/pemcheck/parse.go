// Package pemcheck parses and checks PEM bundles of certificates, public keys
// and private keys, strictly: anything that is not a well-formed, parseable
// block of a known type is an error naming the file and the block. It is
// pure apart from ReadFile, so template functions can use it on bytes.
package pemcheck

import (
	"bytes"
	"cmp"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"unicode"
)

// Kind classifies a block. Kinds are bits so options can name sets of them.
type Kind uint8

const (
	Certificate Kind = 1 << iota
	PublicKey
	PrivateKey
	// ECParameters is OpenSSL's "EC PARAMETERS" block, which `openssl ecparam
	// -genkey` writes before the key. It is accepted and ignored, as
	// kube-apiserver and Go's TLS loader do.
	ECParameters

	keyOrCert = Certificate | PublicKey | PrivateKey
)

func (k Kind) String() string {
	var names []string
	for i, name := range []string{"certificate", "public key", "private key", "EC parameters"} {
		if k&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	return cmp.Or(strings.Join(names, " or "), "nothing")
}

// Encoding is the structure a block's DER actually had, which may differ
// from what its PEM type claims (loaders such as Go's TLS and
// kube-apiserver's key reader go by content, so we do too).
type Encoding string

const (
	X509  Encoding = "X.509"  // certificate
	PKIX  Encoding = "PKIX"   // SubjectPublicKeyInfo, "PUBLIC KEY"
	PKCS1 Encoding = "PKCS#1" // RSA only, public or private
	PKCS8 Encoding = "PKCS#8" // private key of any algorithm
	SEC1  Encoding = "SEC1"   // "EC PRIVATE KEY"
)

// Block is one parsed PEM block. Its String and GoString methods print only
// its position and type, so a Block logged with %v or %#v leaks no key.
type Block struct {
	Index    int    // 1-based position in the file
	Line     int    // 1-based line of its BEGIN
	Type     string // PEM type, e.g. "CERTIFICATE"
	Kind     Kind
	Encoding Encoding

	Cert    *x509.Certificate // set for certificates
	Public  crypto.PublicKey  // set for every key or certificate
	Private crypto.PrivateKey // set for private keys only
}

func (b Block) String() string {
	return fmt.Sprintf("block %d (line %d, %s)", b.Index, b.Line, b.Type)
}

// GoString keeps %#v from dumping a private key's numbers into a log.
func (b Block) GoString() string { return "pemcheck.Block{" + b.String() + "}" }

// File is a parsed PEM file.
type File struct {
	Name   string
	Blocks []Block
	// apiserverKeys is what kube-apiserver would load from the same bytes,
	// kept to compare with Blocks (see Options.APIServerSAKeys).
	apiserverKeys []APIServerKey
}

// APIServerKeys is what kube-apiserver's --service-account-key-file reader
// would load from the file (see the function of that name).
func (f *File) APIServerKeys() []APIServerKey { return f.apiserverKeys }

// ReadFile reads and parses the PEM file at path.
func ReadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The PathError's own message would repeat the path.
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = fmt.Errorf("%s: %w", pe.Op, pe.Err)
		}
		return nil, &Error{File: path, Err: err}
	}
	return Parse(path, data)
}

var (
	beginMarker = []byte("-----BEGIN ")
	endMarker   = []byte("\n-----END ")
)

// Parse parses every PEM block in data; name is used in errors only.
// Non-PEM bytes before, between or after blocks are an error, unlike
// encoding/pem, which silently skips them: a bundle with a stray paste in it
// is a broken bundle. So is a block encoding/pem would not see (after a
// byte-order mark, or with its BEGIN indented). Parse stops at the first structural problem (where the
// next block starts is then unknowable) but reports every block that fails
// to parse. On error it returns a nil File.
func Parse(name string, data []byte) (*File, error) {
	f := &File{Name: name}
	var errs []error
	rest := data
	// encoding/pem, and so kube-apiserver and Go's TLS loader, only see a
	// BEGIN at the very start of the data or of a line: after a byte-order
	// mark or indentation the block is skipped without a word, which for a
	// service-account key means tokens refused. The rest is still parsed so
	// that every problem is reported at once.
	if bom := []byte("\xef\xbb\xbf"); bytes.HasPrefix(rest, bom) {
		errs = append(errs, &Error{File: name, Line: 1, Err: fmt.Errorf("%w: a byte-order mark hides the block after it; save the file without BOM", ErrInvisible)})
		rest = rest[len(bom):]
	}
	line := 1
	for index := 1; ; index++ {
		trimmed := bytes.TrimLeftFunc(rest, unicode.IsSpace)
		space := rest[:len(rest)-len(trimmed)]
		line += bytes.Count(space, []byte("\n"))
		rest = trimmed
		if len(rest) == 0 {
			break
		}
		if indent := space[bytes.LastIndexByte(space, '\n')+1:]; len(indent) > 0 && bytes.HasPrefix(rest, beginMarker) {
			errs = append(errs, &Error{File: name, Block: index, Line: line, Type: pemType(rest),
				Err: fmt.Errorf("%w: whitespace before -----BEGIN hides the block; BEGIN must start its line", ErrInvisible)})
		}
		// Never quote the offending bytes: they may be a key pasted
		// without its armour.
		if !bytes.HasPrefix(rest, beginMarker) {
			return nil, errors.Join(append(errs, &Error{File: name, Line: line, Err: fmt.Errorf("%w where a BEGIN line was expected", ErrNotPEM)})...)
		}
		chunk, err := nextChunk(rest)
		if err != nil {
			return nil, errors.Join(append(errs, &Error{File: name, Block: index, Line: line, Type: pemType(rest), Err: err})...)
		}
		p, after := pem.Decode(chunk)
		if p == nil || len(bytes.TrimSpace(after)) != 0 {
			return nil, errors.Join(append(errs, &Error{File: name, Block: index, Line: line, Type: pemType(rest),
				Err: fmt.Errorf("%w: bad base64, headers or END line", ErrMalformed)})...)
		}
		b := Block{Index: index, Line: line, Type: p.Type}
		if err := parseBlock(&b, p); err != nil {
			errs = append(errs, BlockError(name, &b, err))
		} else {
			f.Blocks = append(f.Blocks, b)
		}
		line += bytes.Count(chunk, []byte("\n"))
		rest = rest[len(chunk):]
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(f.Blocks) == 0 {
		return nil, &Error{File: name, Err: ErrNoBlock}
	}
	f.apiserverKeys = APIServerKeys(data)
	return f, nil
}

// nextChunk returns data up to and including the first END line. Cutting
// there keeps pem.Decode from skipping a broken block and decoding a later
// one in its place.
func nextChunk(data []byte) ([]byte, error) {
	end := bytes.Index(data, endMarker)
	if end < 0 {
		return nil, fmt.Errorf("%w: no END line", ErrMalformed)
	}
	stop := len(data)
	if eol := bytes.IndexByte(data[end+1:], '\n'); eol >= 0 {
		stop = end + 1 + eol + 1
	}
	chunk := data[:stop]
	if bytes.Count(chunk, beginMarker) != 1 {
		return nil, fmt.Errorf("%w: BEGIN without END", ErrMalformed)
	}
	return chunk, nil
}

// pemType reads the type from a BEGIN line for error messages about blocks
// that did not decode.
func pemType(data []byte) string {
	first, _, _ := bytes.Cut(data, []byte("\n"))
	t := strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(string(first), string(beginMarker))), "-----")
	if len(t) > 40 {
		t = t[:40] + "..."
	}
	return t
}

func parseBlock(b *Block, p *pem.Block) error {
	if p.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(p.Headers["Proc-Type"], "ENCRYPTED") {
		return ErrEncrypted
	}
	switch p.Type {
	case "CERTIFICATE":
		c, err := x509.ParseCertificate(p.Bytes)
		if err != nil {
			return fmt.Errorf("%w: certificate: %w", ErrParse, err)
		}
		b.Kind, b.Encoding, b.Cert, b.Public = Certificate, X509, c, c.PublicKey
		return nil
	case "PUBLIC KEY", "RSA PUBLIC KEY", "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY":
		return parseKey(b, p)
	case "EC PARAMETERS":
		b.Kind = ECParameters
		return nil
	default:
		return fmt.Errorf("%w %q", ErrUnknownType, p.Type)
	}
}

// parser reads a key's DER in one encoding.
type parser struct {
	enc   Encoding
	parse func([]byte) (any, error)
}

var (
	pkixPublic  = parser{PKIX, x509.ParsePKIXPublicKey}
	pkcs1Public = parser{PKCS1, func(d []byte) (any, error) { return x509.ParsePKCS1PublicKey(d) }}
	pkcs1       = parser{PKCS1, func(d []byte) (any, error) { return x509.ParsePKCS1PrivateKey(d) }}
	pkcs8       = parser{PKCS8, x509.ParsePKCS8PrivateKey}
	sec1        = parser{SEC1, func(d []byte) (any, error) { return x509.ParseECPrivateKey(d) }}
	// keyParsers are the encodings tried for each key type, the labelled
	// one first: its error is the one that explains the problem.
	keyParsers = map[string][]parser{
		"PUBLIC KEY":      {pkixPublic, pkcs1Public},
		"RSA PUBLIC KEY":  {pkcs1Public, pkixPublic},
		"PRIVATE KEY":     {pkcs8, pkcs1, sec1},
		"RSA PRIVATE KEY": {pkcs1, pkcs8, sec1},
		"EC PRIVATE KEY":  {sec1, pkcs8, pkcs1},
	}
)

func parseKey(b *Block, p *pem.Block) error {
	kind, what := PublicKey, "public key"
	if strings.HasSuffix(p.Type, "PRIVATE KEY") {
		kind, what = PrivateKey, "private key"
	}
	var first error
	for _, t := range keyParsers[p.Type] {
		k, err := t.parse(p.Bytes)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		if kind == PrivateKey {
			// Every private key type x509 parses has its public half.
			b.Private, k = k, k.(interface{ Public() crypto.PublicKey }).Public()
		}
		b.Kind, b.Encoding, b.Public = kind, t.enc, k
		return nil
	}
	// x509 and asn1 errors describe structure, never the key's bytes.
	return fmt.Errorf("%w: %s: %w", ErrParse, what, first)
}
