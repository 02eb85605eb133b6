package saferestart

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/keysync/confd/internal/keytest"
)

// A key present twice in a bundle is a warning naming it and its lines;
// the exit code is the check's own (0 here: the same key from two hosts is
// legitimate).
func TestCheckWarnsAboutADuplicateKey(t *testing.T) {
	pub := func() ([]byte, string) {
		k := keytest.EC(t)
		return keytest.PublicPEM(t, &k.PublicKey), keytest.KeyID(t, &k.PublicKey)
	}
	a, akid := pub()
	b, _ := pub()
	bundle := filepath.Join(t.TempDir(), "sa-bundle.pem")
	if err := os.WriteFile(bundle, append(append(append([]byte{}, a...), b...), a...), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, []string{"check", "--public-only", bundle}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := progName + " check: warning: " + bundle + ": key " + akid + " appears 2 times (lines 1, 9): harmless when several hosts publish the same key (a shared sa.key); otherwise a host publishes its key twice\n"
	if errb.String() != want {
		t.Fatalf("stderr %q\nwant   %q", errb.String(), want)
	}
	// No duplicate, no warning.
	if err := os.WriteFile(bundle, append(append([]byte{}, a...), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := run(context.Background(), nil, []string{"check", bundle}, &out, &errb); code != exitOK || errb.Len() != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}
