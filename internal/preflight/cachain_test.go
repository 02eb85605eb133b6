package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
)

// Issue 34: `check --public-only` passed leaf.crt + ca.crt in one file, so
// a bundle made every apiserver trust the CA's key. check refuses a CA's
// key in any file it is given, and preflight in any
// --service-account-key-file, naming the file and the block; a CA bundle
// where a CA belongs (--client-ca-file) is untouched.
func TestCAKeyRefused(t *testing.T) {
	p := newPKI(t)
	ca := etcdtest.NewCA(t, "sa-ca")
	exp := time.Now().Add(time.Hour)
	leaf, _ := ca.Issue(t, "master-1", false, exp)
	renewed, _ := ca.Issue(t, "master-1", false, exp)
	chain := p.write(t, "chain.crt", leaf, ca.PEM)
	leaves := p.write(t, "renewal.crt", leaf, renewed)
	leafLines := strings.Count(string(leaf), "\n")
	ctx := context.Background()

	for _, opts := range []CheckOptions{{PublicOnly: true}, {}} {
		err := CheckFiles(ctx, []string{chain}, opts)
		if !errors.Is(err, pemcheck.ErrCA) {
			t.Fatalf("check %+v of leaf + CA: %v, want ErrCA", opts, err)
		}
		if want := fmt.Sprintf("%s: block 2 (line %d, CERTIFICATE): ", chain, leafLines+1); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
		if err := CheckFiles(ctx, []string{leaves}, opts); err != nil {
			t.Errorf("check %+v of two leaves (a renewal): %v", opts, err)
		}
	}

	flags := p.flags(t, "--service-account-key-file={sa.pub}\n--service-account-key-file={chain.crt}\n--client-ca-file={ca.crt}\n")
	err := Run(ctx, Input{FlagsFiles: []string{flags}})
	if !errors.Is(err, pemcheck.ErrCA) || !strings.Contains(err.Error(), "--service-account-key-file (") || !strings.Contains(err.Error(), chain+": block 2") {
		t.Fatalf("preflight of a CA in --service-account-key-file: %v", err)
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 1 {
		t.Errorf("%d problems, want the CA alone: %v", n, err)
	}
	flags = p.flags(t, "--service-account-key-file={sa.pub}\n--service-account-key-file={renewal.crt}\n--client-ca-file={ca.crt}\n")
	if err := Run(ctx, Input{FlagsFiles: []string{flags}}); err != nil {
		t.Fatalf("preflight of two leaves: %v", err)
	}
}

// Issue 34 point 8: an RSA key under 2048 bits already published is warned
// about, file and block named, and refuses nothing: failing the check would
// stop every later bundle, dropping the key would refuse its live tokens.
func TestWeakKeyWarns(t *testing.T) {
	p := newPKI(t) // sa.pub: two RSA-1024 keys
	strong := p.write(t, "strong.pub", keytest.PublicPEM(t, &keytest.RSA(t, 2048).PublicKey))
	weakLine := strings.Count(string(keytest.PublicPEM(t, &keytest.RSA(t, 1024).PublicKey)), "\n") + 1
	var warned []error
	warn := func(err error) { warned = append(warned, err) }
	ctx := context.Background()

	if err := CheckFiles(ctx, []string{p.path("sa.pub"), strong}, CheckOptions{PublicOnly: true, Warn: warn}); err != nil {
		t.Fatalf("check refused weak keys: %v", err)
	}
	want := []string{
		p.path("sa.pub") + ": block 1 (line 1, PUBLIC KEY): RSA key under 2048 bits: 1024 bits",
		fmt.Sprintf("%s: block 2 (line %d, PUBLIC KEY): RSA key under 2048 bits: 1024 bits", p.path("sa.pub"), weakLine),
	}
	check := func(what string) {
		t.Helper()
		if len(warned) != len(want) {
			t.Fatalf("%s: warnings %v, want %d", what, warned, len(want))
		}
		for i, w := range warned {
			if !errors.Is(w, pemcheck.ErrWeakKey) || !strings.HasPrefix(w.Error(), want[i]) {
				t.Errorf("%s: warning %q, want %q…", what, w, want[i])
			}
		}
	}
	check("check")

	// A file two flags name is warned about once.
	warned = nil
	flags := p.flags(t, "--service-account-key-file={sa.pub}\n--service-account-key-file={strong.pub}\n--service-account-key-file={sa.pub}\n--service-account-signing-key-file={sa.key}\n")
	if err := Run(ctx, Input{FlagsFiles: []string{flags}, Warn: warn}); err != nil {
		t.Fatalf("preflight refused weak keys: %v", err)
	}
	check("preflight")

	// Without Warn nothing is told and nothing fails.
	if err := CheckFiles(ctx, []string{p.path("sa.pub")}, CheckOptions{}); err != nil {
		t.Fatal(err)
	}
}
