package saferestart

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
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
	if code := run(context.Background(), nil, []string{"check", "--public-only", bundle}, &out, &errb); code != cmdkit.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := cmdkit.ProgName + " check: warning: " + bundle + ": key " + akid + " appears 2 times (lines 1, 9): harmless when several hosts publish the same key (a shared sa.key); otherwise a host publishes its key twice\n"
	if errb.String() != want {
		t.Fatalf("stderr %q\nwant   %q", errb.String(), want)
	}
	// No duplicate, no warning.
	if err := os.WriteFile(bundle, append(append([]byte{}, a...), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := run(context.Background(), nil, []string{"check", bundle}, &out, &errb); code != cmdkit.ExitOK || errb.Len() != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

// A bundle without this host's own key (--require-key names its sa.key or
// sa.pub, as the shipped check_cmd does) says how the key gets there: it is
// published, then confd renders again. Another required key keeps the
// plain message, which names its key ID only.
func TestCheckOwnKeyMissingSaysPublish(t *testing.T) {
	dir := t.TempDir()
	own, other := keytest.EC(t), keytest.EC(t)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bundle := write("sa-bundle.pem", keytest.PublicPEM(t, &other.PublicKey))
	saKey := write("sa.key", keytest.PKCS8PEM(t, own))
	peer := write("peer.pub", keytest.PublicPEM(t, &own.PublicKey))
	kid := keytest.KeyID(t, &own.PublicKey)
	const publish = "is not in the bundle: publish it (`kube-apiserver-safe-restart publish-key`, as sa-key-publish.service runs it) and let confd render again"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check", "--public-only", "--signing-key", saKey, "--require-key", saKey, bundle},
			"this host's own key " + kid + " (--require-key " + saKey + ") " + publish},
		{[]string{"check", "--public-only", "--require-key", peer, bundle},
			"key ID " + kid + " of --require-key " + peer},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), nil, tc.args, &out, &errb)
		if code != cmdkit.ExitPreflight || !bytes.Contains(errb.Bytes(), []byte(tc.want)) {
			t.Errorf("%v: exit %d (want %d), stderr lacks %q:\n%s", tc.args, code, cmdkit.ExitPreflight, tc.want, errb.String())
		}
		if tc.args[2] == "--require-key" && bytes.Contains(errb.Bytes(), []byte("publish it")) {
			t.Errorf("%v: another host's key is not this host's to publish:\n%s", tc.args, errb.String())
		}
	}
}

// check --require-signing-keys cannot tell whether the bundle drops a live
// signing key when etcd does not answer: it refuses, naming the endpoint
// and where it came from (here the --config file, as the shipped check_cmd
// reads it). Without the flag, and with require-signing-keys in the file
// (read from the command line only), the same check reads no etcd.
func TestCheckRequireSigningKeysEtcdDown(t *testing.T) {
	k := keytest.EC(t)
	dir := t.TempDir()
	bundle := filepath.Join(dir, "sa-bundle.pem")
	if err := os.WriteFile(bundle, keytest.PublicPEM(t, &k.PublicKey), 0o644); err != nil {
		t.Fatal(err)
	}
	dead := etcdtest.UnusedEndpoint(t)
	conf := filepath.Join(dir, "safe-restart.toml")
	if err := os.WriteFile(conf, []byte("endpoints = [\""+dead+"\"]\ndial-timeout = \"300ms\"\nrequire-signing-keys = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), nil, []string{"check", "--config", conf, "--public-only", "--require-signing-keys", bundle}, &out, &errb)
	if code != cmdkit.ExitError || !strings.Contains(errb.String(), "etcd did not answer") || !strings.Contains(errb.String(), dead) ||
		!strings.Contains(errb.String(), conf) {
		t.Fatalf("etcd down: exit %d, want %d naming etcd, %s and %s\n%s", code, cmdkit.ExitError, dead, conf, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), nil, []string{"check", "--config", conf, "--public-only", bundle}, &out, &errb); code != cmdkit.ExitOK || errb.Len() != 0 {
		t.Fatalf("without --require-signing-keys: exit %d\n%s", code, errb.String())
	}
}
