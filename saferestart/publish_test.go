package saferestart

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

type testKey struct {
	priv  crypto.Signer
	pub   crypto.PublicKey
	kid   string
	pkix  []byte // PUBLIC KEY, as pemNormalize writes it
	pkcs8 []byte // PRIVATE KEY
}

func newTestKey(t *testing.T, ec bool) testKey {
	t.Helper()
	var k testKey
	if ec {
		k.priv = keytest.EC(t)
	} else {
		k.priv = keytest.RSA(t, 2048)
	}
	k.pub = k.priv.Public()
	var err error
	if k.pkix, err = pemcheck.PublicPEM(k.pub); err != nil {
		t.Fatal(err)
	}
	k.kid = keytest.KeyID(t, k.pub)
	k.pkcs8 = keytest.PKCS8PEM(t, k.priv)
	return k
}

// certificate is a self-signed certificate of k, valid now (each call's
// has its own serial number).
func (k testKey) certificate(t *testing.T) []byte {
	t.Helper()
	return keytest.CertPEM(t, k.priv, "sa", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
}

type publishEnv struct {
	srv  *etcdtest.Server
	dir  string
	host string
}

func newPublishEnv(t *testing.T) *publishEnv {
	return &publishEnv{srv: etcdtest.Start(t), dir: t.TempDir(), host: "m1.example"}
}

func (e *publishEnv) file(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs publish-key and returns its exit code, the published value and
// its mod revision (0: absent).
func (e *publishEnv) run(t *testing.T, args ...string) (int, string, int64, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), nil, append([]string{"publish-key", "--config", "", "--endpoints", e.srv.Endpoint, "--host", e.host}, args...), &out, &errb)
	resp, err := e.srv.Client(t).Get(context.Background(), "/kubernetes/service-account-keys/"+e.host)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return code, "", 0, errb.String()
	}
	return code, string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision, errb.String()
}

// publish-key writes sa.pub's keys canonically (PKIX, sorted by key ID),
// writes nothing when only the encoding changed, refuses what check
// refuses with nothing written, and derives the key from --signing-key
// only without --public-key.
func TestPublishKey(t *testing.T) {
	e := newPublishEnv(t)
	a, b := newTestKey(t, false), newTestKey(t, true)
	rsaPKCS1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(a.pub.(*rsa.PublicKey))})
	want := string(a.pkix) + string(b.pkix)
	if b.kid < a.kid {
		want = string(b.pkix) + string(a.pkix)
	}
	// Two keys, as during a rotation, in the order rotate-key appends
	// them, one with CRLF line endings.
	pub := e.file(t, "sa.pub", append(append([]byte(nil), b.pkix...), bytes.ReplaceAll(a.pkix, []byte("\n"), []byte("\r\n"))...))
	code, value, rev, stderr := e.run(t, "--public-key", pub)
	if code != cmdkit.ExitOK || value != want {
		t.Fatalf("first publish: exit %d, value:\n%s\nwant:\n%s\n%s", code, value, want, stderr)
	}
	// The same keys in another order and encoding: no new revision.
	e.file(t, "sa.pub", append(append([]byte(nil), a.pkix...), b.pkix...))
	if code, value2, rev2, stderr := e.run(t, "--public-key", pub); code != cmdkit.ExitOK || value2 != want || rev2 != rev || !strings.Contains(stderr, "unchanged") {
		t.Fatalf("republish: exit %d rev %d -> %d\n%s", code, rev, rev2, stderr)
	}
	// Refused as check refuses them: a private key, a byte-order mark,
	// garbage, a PKCS#1 RSA key kube-apiserver skips; nothing written, the
	// key never quoted.
	for name, data := range map[string][]byte{
		"pkcs1":   rsaPKCS1,
		"private": append(append([]byte(nil), a.pkix...), b.pkcs8...),
		"bom":     append([]byte("\xef\xbb\xbf"), a.pkix...),
		"garbage": []byte("-----BEGIN PUBLIC KEY-----\nZ2FyYmFnZQ==\n-----END PUBLIC KEY-----\n"),
	} {
		p := e.file(t, name+".pub", data)
		code, value3, rev3, stderr := e.run(t, "--public-key", p)
		if code != cmdkit.ExitPreflight || value3 != want || rev3 != rev {
			t.Errorf("%s: exit %d, rev %d -> %d; want 3 and nothing written\n%s", name, code, rev, rev3, stderr)
		}
		if strings.Contains(stderr, strings.Split(string(b.pkcs8), "\n")[1]) {
			t.Errorf("%s: the private key reached the log", name)
		}
	}
	// Only --signing-key: its public half; b, which it lacks, stays
	// published as superseded (a key leaves only by retirement). Both:
	// --public-key wins.
	key := e.file(t, "sa.key", a.pkcs8)
	if code, value4, _, stderr := e.run(t, "--signing-key", key); code != cmdkit.ExitOK || value4 != want || !strings.Contains(stderr, "superseded key "+b.kid) {
		t.Fatalf("--signing-key: exit %d value %q\n%s", code, value4, stderr)
	}
	if code, value5, _, stderr := e.run(t, "--signing-key", key, "--public-key", pub); code != cmdkit.ExitOK || value5 != want {
		t.Fatalf("--signing-key with --public-key: exit %d value %q\n%s", code, value5, stderr)
	}
}

// The shipped configuration's keys drive publish-key as every other
// subcommand: etcd and the files from the file, nothing on the command line.
func TestPublishKeyFromConfig(t *testing.T) {
	e := newPublishEnv(t)
	a := newTestKey(t, true)
	pub := e.file(t, "sa.pub", a.pkix)
	cfg := writeConfig(t, "endpoints = [\""+e.srv.Endpoint+"\"]\npublic-key = \""+pub+"\"\nhost = \"cfg.example\"\n")
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, []string{"publish-key", "--config", cfg}, &out, &errb); code != cmdkit.ExitOK {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	resp, err := e.srv.Client(t).Get(context.Background(), "/kubernetes/service-account-keys/cfg.example")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != string(a.pkix) {
		t.Fatalf("published %v %v", resp, err)
	}
}

// publish-key --certificate publishes the certificate; a renewal with the
// same key replaces it, one with a new key keeps the previous one beside it
// until retire-keys after --grace, never while sa.key still signs with it.
func TestPublishCertificateKeepsThePreviousKey(t *testing.T) {
	e := newPublishEnv(t)
	a, b := newTestKey(t, false), newTestKey(t, true)
	certA1, certA2, certB := a.certificate(t), a.certificate(t), b.certificate(t)
	crt := e.file(t, "sa.crt", certA1)
	if code, value, _, stderr := e.run(t, "--certificate", crt); code != cmdkit.ExitOK || value != string(certA1) {
		t.Fatalf("first certificate: exit %d value %q\n%s", code, value, stderr)
	}
	// Renewed with the same key: the new certificate replaces the old.
	e.file(t, "sa.crt", certA2)
	if code, value, _, stderr := e.run(t, "--certificate", crt); code != cmdkit.ExitOK || value != string(certA2) {
		t.Fatalf("same-key renewal: exit %d value %q\n%s", code, value, stderr)
	}
	// Renewed with a new key: both published, sorted by key ID.
	e.file(t, "sa.crt", certB)
	both := string(certA2) + string(certB)
	if b.kid < a.kid {
		both = string(certB) + string(certA2)
	}
	code, value, rev, stderr := e.run(t, "--certificate", crt, "--grace", "1h")
	if code != cmdkit.ExitOK || value != both || !strings.Contains(stderr, a.kid) {
		t.Fatalf("new-key renewal: exit %d value %q\n%s", code, value, stderr)
	}
	// Again: nothing changes, no revision.
	if code, value, rev2, stderr := e.run(t, "--certificate", crt, "--grace", "1h"); code != cmdkit.ExitOK || value != both || rev2 != rev {
		t.Fatalf("republish: exit %d rev %d -> %d\n%s", code, rev, rev2, stderr)
	}
	retire := func(extra ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), nil, append([]string{"retire-keys", "--config", "", "--endpoints", e.srv.Endpoint, "--host", e.host,
			"--signing-key", filepath.Join(e.dir, "sa.key"), "--public-key", filepath.Join(e.dir, "sa.pub")}, extra...), &out, &errb)
		resp, err := e.srv.Client(t).Get(context.Background(), "/kubernetes/service-account-keys/"+e.host)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("published value: %v", err)
		}
		return code, string(resp.Kvs[0].Value), errb.String()
	}
	e.file(t, "sa.key", b.pkcs8)
	if code, value, stderr := retire(); code != cmdkit.ExitOK || value != both {
		t.Fatalf("retire-keys before the grace: exit %d value %q\n%s", code, value, stderr)
	}
	// The grace is over (the record says so).
	keptKey := "/kubernetes/service-account-keys-rotation/" + e.host + "/kept"
	e.srv.Put(t, keptKey, `{"host":"`+e.host+`","keep":{"`+a.kid+`":"`+time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)+`"}}`)
	// Not while sa.key still signs with the previous key.
	e.file(t, "sa.key", a.pkcs8)
	if code, value, stderr := retire(); code != cmdkit.ExitOK || value != both || !strings.Contains(stderr, "still signs with it") {
		t.Fatalf("retire-keys while signing with the kept key: exit %d value %q\n%s", code, value, stderr)
	}
	e.file(t, "sa.key", b.pkcs8)
	if code, value, stderr := retire(); code != cmdkit.ExitOK || value != string(certB) {
		t.Fatalf("retire-keys after the grace: exit %d value %q\n%s", code, value, stderr)
	}
	// A retired key is never published again: a source of retired keys
	// only is refused (exit 3), naming the key.
	e.file(t, "sa.crt", certA1)
	if code, value, _, stderr := e.run(t, "--certificate", crt); code != cmdkit.ExitPreflight || value != string(certB) || !strings.Contains(stderr, a.kid) {
		t.Fatalf("republish of a retired key: exit %d value %q\n%s", code, value, stderr)
	}
	// --grace 0: the replaced key is still superseded, not dropped, and the
	// next retire-keys retires it.
	c := newTestKey(t, true)
	certC := c.certificate(t)
	e.file(t, "sa.crt", certC)
	bc := string(certB) + string(certC)
	if c.kid < b.kid {
		bc = string(certC) + string(certB)
	}
	if code, value, _, stderr := e.run(t, "--certificate", crt, "--grace", "0s"); code != cmdkit.ExitOK || value != bc {
		t.Fatalf("--grace 0: exit %d value %q\n%s", code, value, stderr)
	}
	e.file(t, "sa.key", c.pkcs8)
	if code, value, stderr := retire(); code != cmdkit.ExitOK || value != string(certC) {
		t.Fatalf("retire-keys after --grace 0: exit %d value %q\n%s", code, value, stderr)
	}
}

// publish-key publishes one host's keys, which every apiserver then
// trusts: a certificate chain (its CA's key could sign tokens everywhere),
// two leaves, or an RSA key too weak for the signer are refused, exit 3,
// naming file and block, nothing written; check of a bundle already
// holding a weak key warns and passes (refusing it would refuse the tokens
// it signed).
func TestPublishKeyRefusesCAsLeavesAndWeakKeys(t *testing.T) {
	e := newPublishEnv(t)
	caKey, leafKey, otherKey := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	caPEM, ca := keytest.IssuedCertPEM(t, caKey.Public(), x509.Certificate{
		Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, caKey)
	leaf := func(pub crypto.PublicKey, cn string) []byte {
		p, _ := keytest.IssuedCertPEM(t, pub, x509.Certificate{Subject: pkix.Name{CommonName: cn}, BasicConstraintsValid: true}, ca, caKey)
		return p
	}
	weak := keytest.RSA(t, 1024)
	for _, c := range []struct {
		name, flag string
		data       []byte
		want       string
	}{
		{"chain.crt", "--certificate", append(leaf(leafKey.Public(), "m1"), caPEM...), "block 2"},
		{"leaves.crt", "--certificate", append(leaf(leafKey.Public(), "m1"), leaf(otherKey.Public(), "m2")...), "more than one leaf"},
		{"weak.pub", "--public-key", keytest.PublicPEM(t, weak.Public()), "under 2048 bits"},
		{"weak.key", "--signing-key", keytest.PKCS8PEM(t, weak), "under 2048 bits"},
	} {
		p := e.file(t, c.name, c.data)
		code, value, _, stderr := e.run(t, c.flag, p)
		if code != cmdkit.ExitPreflight || value != "" || !strings.Contains(stderr, p) || !strings.Contains(stderr, c.want) {
			t.Errorf("%s %s: exit %d, published %q; want 3 naming the file and %q, nothing written:\n%s", c.flag, c.name, code, value, c.want, stderr)
		}
	}
	bundle := e.file(t, "bundle.pem", append(keytest.PublicPEM(t, leafKey.Public()), keytest.PublicPEM(t, weak.Public())...))
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, []string{"check", "--config", "", "--public-only", bundle}, &out, &errb); code != cmdkit.ExitOK || !strings.Contains(errb.String(), "warning") || !strings.Contains(errb.String(), "under 2048 bits") {
		t.Errorf("check of a bundle with a published RSA-1024 key: exit %d, want 0 with a warning:\n%s", code, errb.String())
	}
}

// publish-key --public-key on a reimaged host: the lost key stays
// published as superseded; an operator's edit that drops it is healed by
// the next publish; once retired, a sa.pub still holding it loses it
// (logged) and the value never holds it again.
func TestPublishKeySupersedesAndHeals(t *testing.T) {
	e := newPublishEnv(t)
	old, cur := newTestKey(t, true), newTestKey(t, true)
	both := string(old.pkix) + string(cur.pkix)
	if cur.kid < old.kid {
		both = string(cur.pkix) + string(old.pkix)
	}
	pub := e.file(t, "sa.pub", old.pkix)
	if code, _, _, stderr := e.run(t, "--public-key", pub); code != cmdkit.ExitOK {
		t.Fatalf("first publish: exit %d\n%s", code, stderr)
	}
	// Reimaged: a new key pair, the old one lost.
	e.file(t, "sa.pub", cur.pkix)
	if code, value, _, stderr := e.run(t, "--public-key", pub, "--grace", "1h"); code != cmdkit.ExitOK || value != both || !strings.Contains(stderr, "superseded key "+old.kid) {
		t.Fatalf("publish after the reimage: exit %d value %q\n%s", code, value, stderr)
	}
	// An operator drops the old key by hand: the next write puts it back.
	e.srv.Put(t, "/kubernetes/service-account-keys/"+e.host, string(cur.pkix))
	if code, value, _, stderr := e.run(t, "--public-key", pub, "--grace", "1h"); code != cmdkit.ExitOK || value != both {
		t.Fatalf("publish after the edit: exit %d value %q\n%s", code, value, stderr)
	}
	// Retired (as retire-keys writes it); sa.pub holds it again beside
	// the current key: the value leaves it out and sa.pub loses it.
	rec := `{"host":"` + e.host + `","retired":{"` + old.kid + `":"` + time.Now().UTC().Format(time.RFC3339) + `"}}`
	e.srv.Put(t, "/kubernetes/service-account-keys-rotation/"+e.host+"/kept", rec)
	e.file(t, "sa.pub", []byte(both))
	code, value, _, stderr := e.run(t, "--public-key", pub)
	if code != cmdkit.ExitOK || value != string(cur.pkix) || !strings.Contains(stderr, "retired key(s) ["+old.kid+"] removed from "+pub) {
		t.Fatalf("publish with a retired key in sa.pub: exit %d value %q\n%s", code, value, stderr)
	}
	if data, _ := os.ReadFile(pub); string(data) != string(cur.pkix) {
		t.Fatalf("sa.pub after the trim:\n%s", data)
	}
}
