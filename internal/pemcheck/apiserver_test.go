package pemcheck

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// apiserverCase is one file of testdata/apiserver and what kube-apiserver
// v1.37.2 made of it as --service-account-key-file.
//
// How loaded was obtained: TestRealAPIServerLoads (PEMCHECK_REMEASURE=1)
// starts kube-apiserver v1.37.2 (scripts/build-kube-apiserver.sh) with each
// file and reads the key IDs its /openid/v1/jwks serves (the same IDs, in
// the same order, as APIServerKeys); 0 means it exited 1 ("data does not contain any
// valid RSA or ECDSA public keys"). Rerun it after changing a file.
type apiserverCase struct {
	file   string
	loaded int // keys the real apiserver served
	// refused is the error a strict check must give (nil: the file passes);
	// line is where it must point (0: not checked).
	refused error
	line    int
}

var apiserverCases = []apiserverCase{
	{file: "rsa.pub", loaded: 1},
	{file: "ec.pub", loaded: 1},
	{file: "two.pub", loaded: 2},
	{file: "cert.pem", loaded: 1},
	{file: "crlf.pub", loaded: 1},
	{file: "trailing-space-begin.pub", loaded: 1},
	{file: "leading-blank-lines.pub", loaded: 1},
	{file: "ec-sec1.key", loaded: 1},
	{file: "bom-first.pub", loaded: 1, refused: ErrInvisible, line: 1},
	{file: "indent-space.pub", loaded: 1, refused: ErrInvisible, line: 10},
	{file: "indent-tab-only.pub", loaded: 0, refused: ErrInvisible, line: 1},
	{file: "indented-whole.pub", loaded: 1, refused: ErrInvisible, line: 5},
	{file: "garbage-between.pub", loaded: 2, refused: ErrNotPEM, line: 10},
	{file: "bad-base64.pub", loaded: 1, refused: ErrMalformed, line: 10},
	{file: "rsa-pkcs1.pub", loaded: 0, refused: ErrSkipped, line: 1},
	{file: "ed25519.pub", loaded: 0, refused: ErrSkipped, line: 1},
	{file: "ec-pkcs8.key", loaded: 0, refused: ErrSkipped, line: 1},
}

func readCase(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "apiserver", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The mirror of keyutil.ParsePublicKeysPEM loads what the real apiserver
// loaded, and the strict check refuses exactly the files in which the
// apiserver loads fewer keys than the file appears to hold, saying where.
func TestAPIServerKeysTable(t *testing.T) {
	for _, c := range apiserverCases {
		t.Run(c.file, func(t *testing.T) {
			data := readCase(t, c.file)
			if got := len(APIServerKeys(data)); got != c.loaded {
				t.Errorf("APIServerKeys: %d keys, the real apiserver loaded %d", got, c.loaded)
			}
			var err error
			f, perr := Parse(c.file, data)
			if perr != nil {
				err = perr
			} else {
				err = f.Check(Options{APIServerSAKeys: true})
			}
			if c.refused == nil {
				if err != nil {
					t.Fatalf("refused a file the apiserver reads whole: %v", err)
				}
				if len(f.Blocks) != c.loaded {
					t.Fatalf("%d blocks, apiserver loaded %d", len(f.Blocks), c.loaded)
				}
				return
			}
			if !errors.Is(err, c.refused) {
				t.Fatalf("err = %v, want %v", err, c.refused)
			}
			var pe *Error
			if c.line > 0 && (!errors.As(err, &pe) || pe.Line != c.line) {
				t.Fatalf("err = %v, want it at line %d", err, c.line)
			}
			if pe.File != c.file {
				t.Fatalf("err names %q, want %q", pe.File, c.file)
			}
		})
	}
}
