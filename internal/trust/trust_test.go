package trust

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/sirupsen/logrus"
)

func write(t *testing.T, dir, name string, data ...[]byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Join(data, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFromFiles(t *testing.T) {
	dir := t.TempDir()
	a, b, signer := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	// kube-apiserver also reads a key from a private key block; a PKCS#1
	// "RSA PUBLIC KEY" block it skips, so the record must not list it.
	rk := keytest.RSA(t, 1024)
	pkcs1 := keytest.Encode("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rk.PublicKey))
	bundle := write(t, dir, "bundle.pem", keytest.PublicPEM(t, &a.PublicKey), pkcs1, keytest.PublicPEM(t, &b.PublicKey))
	extra := write(t, dir, "extra.pem", keytest.PublicPEM(t, &a.PublicKey), keytest.SEC1PEM(t, signer))
	key := write(t, dir, "sa.key", keytest.SEC1PEM(t, signer))
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.FixedZone("x", 3600))
	r, err := FromFiles("m1.example", []string{bundle, extra}, key, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{keytest.KeyID(t, &a.PublicKey), keytest.KeyID(t, &b.PublicKey), keytest.KeyID(t, &signer.PublicKey)}
	if !slices.Equal(r.Trusted, want) {
		t.Fatalf("trusted %v, want %v (file order, duplicates once, PKCS#1 public skipped)", r.Trusted, want)
	}
	if r.Signing != keytest.KeyID(t, &signer.PublicKey) {
		t.Fatalf("signing %q, want %q", r.Signing, keytest.KeyID(t, &signer.PublicKey))
	}
	b1, _ := os.ReadFile(bundle)
	b2, _ := os.ReadFile(extra)
	sum := sha256.Sum256(append(b1, b2...))
	if r.BundleSHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("bundle sha256 %s, want the files' bytes in flag order", r.BundleSHA256)
	}
	if !r.Time.Equal(now) || r.Time.Location() != time.UTC {
		t.Fatalf("time %v, want %v in UTC", r.Time, now)
	}
	// No key material in the record, whatever the files held.
	for _, s := range []string{string(keytest.SEC1PEM(t, signer)), "PRIVATE"} {
		if strings.Contains(r.Trusted[2]+r.Signing, s) {
			t.Fatal("record holds key material")
		}
	}
	if _, err := FromFiles("h", []string{filepath.Join(dir, "missing.pem")}, "", now); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Fatalf("missing file: err %v, want one naming it", err)
	}
	if _, err := FromFiles("h", nil, key, now); err == nil {
		t.Fatal("no key files: no error")
	}
}

func TestReportStaleAndNotTrusting(t *testing.T) {
	published := map[string][]string{"a": {"K1", "K2"}, "b": {"K3"}, "c": {"K4"}}
	records := map[string]Record{
		"a":   {Host: "a", Trusted: []string{"K1", "K2", "K3", "K4"}, Signing: "K1"},
		"b":   {Host: "b", Trusted: []string{"K1", "K3", "K4", "K0"}, Signing: "K3"},
		"old": {Host: "old", Trusted: []string{"K0"}},
	}
	r := build(7, published, map[string]string{}, nil, records, nil)
	if got := strings.Join(r.Keys, ","); got != "K1,K2,K3,K4,K0" {
		t.Fatalf("keys %s", got)
	}
	stale := map[string]bool{}
	for _, h := range r.Hosts {
		stale[h.Host] = h.Stale
	}
	if stale["a"] || !stale["b"] || !stale["c"] || stale["old"] {
		t.Fatalf("stale %v, want b (lacks K2) and c (no record) only", stale)
	}
	if got := r.NotTrustingAmong(Publishers, []string{"K2"}, nil); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("not trusting K2: %v", got)
	}
	if got := r.NotTrustingAmong(Publishers, []string{"K1"}, []string{"c"}); len(got) != 0 {
		t.Fatalf("not trusting K1 excluding c: %v", got)
	}
	if got := r.NotTrustingAmong(Recorded, []string{"K2"}, nil); !slices.Equal(got, []string{"b", "old"}) {
		t.Fatalf("recorded hosts not trusting K2: %v, want b and old (c has no record)", got)
	}
	if rec := r.RecordOf("b"); rec == nil || rec.Signing != "K3" {
		t.Fatalf("RecordOf(b) = %+v", rec)
	}
	if rec := r.RecordOf("c"); rec != nil {
		t.Fatalf("RecordOf(c), a host without a record = %+v", rec)
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"STALE: does not trust K2", "STALE: no trust record", "stale hosts: b, c", "K5 = K0 (no longer published)", "S*"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

func TestWaitWakesOnRecordAndTimesOutNamingHosts(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	p := Prefixes{Keys: "/k", Trust: "/k-trust"}
	a, b, next := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	srv.Put(t, "/k/a", string(keytest.PublicPEM(t, &a.PublicKey))+string(keytest.PublicPEM(t, &next.PublicKey)))
	srv.Put(t, "/k/b", string(keytest.PublicPEM(t, &b.PublicKey)))
	ctx := context.Background()
	put := func(host string, keys ...*ecdsa.PrivateKey) {
		r := Record{Host: host, Time: time.Now(), Trusted: []string{}}
		for _, k := range keys {
			r.Trusted = append(r.Trusted, keytest.KeyID(t, &k.PublicKey))
		}
		if err := Put(ctx, cli, p.Trust, "", r); err != nil {
			t.Fatal(err)
		}
	}
	put("a", a, b, next)
	put("b", a, b)

	// b does not trust next: a short wait ends naming b only.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{keytest.KeyID(t, &next.PublicKey)}})
	cancel()
	var nt *NotTrustedError
	if !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"b"}) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait: %v, want a NotTrustedError naming b", err)
	}

	// A wait in progress returns once b's record trusts next.
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		close(started)
		_, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{keytest.KeyID(t, &next.PublicKey)}})
		done <- err
	}()
	<-started
	put("b", a, b, next)
	if err := <-done; err != nil {
		t.Fatalf("wait after b trusts next: %v", err)
	}

	// Excluding a host: only the others count.
	put("b", a, b)
	wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{keytest.KeyID(t, &next.PublicKey)}, Exclude: []string{"b"}}); err != nil {
		t.Fatalf("wait excluding b: %v", err)
	}
}

func TestWaitTimesOutWhileEtcdIsDown(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := Wait(ctx, cli, WaitOptions{Log: quiet(), Prefixes: Prefixes{Keys: "/k", Trust: "/t"}, Keys: []string{"x"}, OpTimeout: 100 * time.Millisecond})
	var nt *NotTrustedError
	if !errors.As(err, &nt) {
		t.Fatalf("wait with etcd down: %v, want a NotTrustedError", err)
	}
}

// A host that publishes but never recorded trust blocks a plain wait (its
// trust is unknown) and is skipped with SkipUnrecorded.
func TestWaitSkipUnrecorded(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	p := Prefixes{Keys: "/k", Trust: "/k-trust"}
	a, c := keytest.EC(t), keytest.EC(t)
	srv.Put(t, "/k/a", string(keytest.PublicPEM(t, &a.PublicKey)))
	srv.Put(t, "/k/c", string(keytest.PublicPEM(t, &c.PublicKey)))
	if err := Put(context.Background(), cli, p.Trust, "", Record{Host: "a", Trusted: []string{keytest.KeyID(t, &a.PublicKey), keytest.KeyID(t, &c.PublicKey)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := Wait(ctx, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{keytest.KeyID(t, &a.PublicKey)}})
	var nt *NotTrustedError
	if !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"c"}) {
		t.Fatalf("plain wait: %v, want c named", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := Wait(ctx2, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{keytest.KeyID(t, &a.PublicKey)}, SkipUnrecorded: true}); err != nil {
		t.Fatalf("wait skipping unrecorded hosts: %v", err)
	}
}

// Among Recorded, the hosts waited for are those with a record, publishing
// or not (the signer's barrier); a publisher without a record is not, and
// a key deeper than PREFIX/HOST is no host's record.
func TestWaitAmongRecorded(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	p := Prefixes{Keys: "/k", Trust: "/k-trust"}
	a, c := keytest.EC(t), keytest.EC(t)
	srv.Put(t, "/k/a", string(keytest.PublicPEM(t, &a.PublicKey)))
	srv.Put(t, "/k/c", string(keytest.PublicPEM(t, &c.PublicKey))) // no record
	ctx := context.Background()
	for _, r := range []Record{{Host: "a", Trusted: []string{keytest.KeyID(t, &a.PublicKey)}}, {Host: "old", Trusted: []string{"K0"}}} {
		if err := Put(ctx, cli, p.Trust, "", r); err != nil {
			t.Fatal(err)
		}
	}
	srv.Put(t, "/k-trust/x/y", "not a host's record")
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: Prefixes{Trust: p.Trust}, Among: Recorded, Keys: []string{keytest.KeyID(t, &a.PublicKey)}})
	var nt *NotTrustedError
	if !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"old"}) {
		t.Fatalf("wait among recorded: %v, want old named (not c, not x/y)", err)
	}
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: Prefixes{Trust: p.Trust}, Among: Recorded, Keys: []string{keytest.KeyID(t, &a.PublicKey)}})
		done <- err
	}()
	if err := Put(ctx, cli, p.Trust, "", Record{Host: "old", Trusted: []string{"K0", keytest.KeyID(t, &a.PublicKey)}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("wait after old trusts the key: %v", err)
	}
	recs, _, err := List(ctx, cli, p.Trust)
	if _, ok := recs["x/y"]; err != nil || ok || len(recs) != 2 {
		t.Fatalf("List: %v %v, want a and old only", recs, err)
	}
}

// The record is written only while the lock key exists: a helper that lost
// its lock records nothing.
func TestPutNeedsTheLockKey(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	rec := Record{Host: "a", Time: time.Now(), Trusted: []string{"k1"}}
	if err := Put(ctx, cli, "/t", "/lock/abc", rec); !errors.Is(err, ErrLockGone) || !strings.Contains(err.Error(), "/lock/abc") {
		t.Fatalf("put without the lock key: %v, want ErrLockGone naming it", err)
	}
	if recs, _, err := List(ctx, cli, "/t"); err != nil || len(recs) != 0 {
		t.Fatalf("records %v, %v: written without the lock", recs, err)
	}
	srv.Put(t, "/lock/abc", "")
	if err := Put(ctx, cli, "/t", "/lock/abc", rec); err != nil {
		t.Fatal(err)
	}
	if recs, _, _ := List(ctx, cli, "/t"); !slices.Equal(recs["a"].Trusted, []string{"k1"}) {
		t.Fatalf("records %v", recs)
	}
}

// A record that is not one is shown as unparseable, naming its key and
// never its value, and trusts nothing (the host is stale).
func TestGarbageRecordIsUnparseable(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	a := keytest.EC(t)
	srv.Put(t, "/k/a", string(keytest.PublicPEM(t, &a.PublicKey)))
	srv.Put(t, "/k-trust/a", "garbage-value-xyz")
	rep, err := Collect(context.Background(), cli, Prefixes{Keys: "/k", Trust: "/k-trust"})
	if err != nil {
		t.Fatal(err)
	}
	h := rep.Hosts[0]
	if !h.Stale || h.Record == nil || !strings.HasPrefix(h.Record.Unparseable, "unparseable trust record /k-trust/a (") {
		t.Fatalf("host %+v, record %+v", h, h.Record)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, want := range []string{"unparseable  STALE: unparseable trust record /k-trust/a (invalid character 'g' looking for beginning of value): it is replaced at the host's next successful restart; `etcdctl del /k-trust/a` removes it", "stale hosts: a"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "0001-01-01") || strings.Contains(out, "garbage-value-xyz") {
		t.Errorf("text shows a year-1 record or the value:\n%s", out)
	}
	if !slices.Equal(rep.Stale(), []string{"a"}) {
		t.Fatalf("stale %v", rep.Stale())
	}
}

// TestTrustShowsModes: `trust` names signer hosts (records written by
// kube-apiserver-sa-signer) and bundle hosts side by side.
func TestTrustShowsModes(t *testing.T) {
	rep := build(1, map[string][]string{"m1": {"k1"}, "m2": {"k2"}}, nil, nil, map[string]Record{
		"m1": {Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k1"},
		"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2", Source: SignerSource},
	}, nil)
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[0], "MODE") || !strings.Contains(lines[1], "bundle") || !strings.Contains(lines[2], "signer") {
		t.Fatalf("trust table:\n%s", b.String())
	}
}

// The controller-manager's key: shown as "C" in `trust`; an older record
// without it decodes to "" and names no host.
func TestControllerManagerSigning(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	if err := Put(ctx, cli, DefaultPrefix, "", Record{Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k2", ControllerManagerSigning: "k1"}); err != nil {
		t.Fatal(err)
	}
	srv.Put(t, Key(DefaultPrefix, "m2"), `{"host":"m2","trusted":["k1","k2"],"signing":"k1","bundle_sha256":"x","time":"2026-01-01T00:00:00Z"}`)
	recs, _, err := List(ctx, cli, DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if recs["m1"].ControllerManagerSigning != "k1" || recs["m2"].ControllerManagerSigning != "" {
		t.Fatalf("records %+v", recs)
	}
	if got := ControllerManagersSigningWith(recs, "k1"); !slices.Equal(got, []string{"m1"}) {
		t.Fatalf("controller-managers signing with k1: %v, want [m1]", got)
	}
	if got := ControllerManagersSigningWith(recs, ""); len(got) != 0 {
		t.Fatalf("controller-managers signing with no key: %v", got)
	}
	rep := build(1, map[string][]string{"m1": {"k2"}, "m2": {"k1"}}, nil, nil, recs, nil)
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "TC") || !strings.Contains(b.String(), "C its kube-controller-manager") {
		t.Fatalf("trust table does not show the controller-manager's key:\n%s", b.String())
	}
}

// quiet is the logger of a Wait in these tests: it discards.
func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.Out = io.Discard
	return l
}
