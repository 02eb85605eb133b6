package saferestart

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/trust"
)

// The rotation prefix's default (saferestart/internal/rotation is not
// importable from here).
const rotPrefix = "/kubernetes/service-account-keys-rotation"

// forgetFleet is four masters publishing one key each, each trusting
// every key, with m3 and m4 dead: m3 left a rotation state, a waiting
// record and an orphaned restart intent under the lock "fh".
type forgetFleet struct {
	srv   *etcdtest.Server
	cli   *clientv3.Client
	env   []string
	hosts map[string]*keyHost
}

func newForgetFleet(t *testing.T) *forgetFleet {
	t.Helper()
	srv := etcdtest.Start(t)
	f := &forgetFleet{srv: srv, cli: srv.Client(t), env: env(srv), hosts: map[string]*keyHost{}}
	ctx := context.Background()
	var kids []string
	for _, n := range []string{"m1", "m2", "m3", "m4"} {
		h := newKeyHost(t, n)
		f.hosts[n] = h
		kids = append(kids, h.kid)
		srv.Put(t, trust.DefaultKeysPrefix+"/"+n, value(t, h.pub))
	}
	for n, h := range f.hosts {
		if err := trust.Put(ctx, f.cli, trust.DefaultPrefix, "", trust.Record{Host: n, Trusted: kids, Signing: h.kid, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Put(t, rotPrefix+"/m3/state", `{"host":"m3","phase":"published","previous":"`+f.hosts["m3"].kid+`","next":"K9"}`)
	srv.Put(t, rotPrefix+"/m3/waiting", `{"host":"m3","keys":["K9"],"pid":1}`)
	srv.Put(t, "fh-hold/intent/m3", `{"host":"m3","lease":1234,"started":"2026-01-01T00:00:00Z"}`)
	return f
}

func (f *forgetFleet) forget(t *testing.T, host string, more ...string) *proc {
	t.Helper()
	return runBin(t, f.env, append([]string{"forget-host", "--lock-name", "fh", "--host", "m1", host}, more...)...)
}

// revision is etcd's current revision: unchanged, nothing was written.
func (f *forgetFleet) revision(t *testing.T) int64 {
	t.Helper()
	resp, err := f.cli.Get(context.Background(), "nothing")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// forget-host refuses (exit 3, naming the evidence, nothing written) while
// the host's publisher keeps its alive record, while its apiserver's
// identity Lease is live, for this host itself and for a name etcd does
// not know; --dry-run says what it would do and writes nothing.
func TestForgetHostRefusalsAndDryRun(t *testing.T) {
	f := newForgetFleet(t)
	ctx := context.Background()
	lease, err := f.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Put(ctx, rotPrefix+"/m3/alive", `{"host":"m3"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	rev := f.revision(t)
	if p := f.forget(t, "m3"); p.code != codePreflight || !strings.Contains(p.stderr.String(), rotPrefix+"/m3/alive exists") {
		t.Fatalf("forget-host with m3's alive record: exit %d, want 3 naming the record:\n%s", p.code, p.stderr)
	}
	// The revoke (deleting the alive record) is the only write so far.
	if _, err := f.cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if got := f.revision(t); got != rev+1 {
		t.Fatalf("revision %d after the refusal, want %d: it wrote", got, rev+1)
	}
	// A restart intent on a live lease: m3 restarts now.
	intentLease, err := f.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	orphan, _ := getKey(t, f.cli, "fh-hold/intent/m3")
	f.srv.Put(t, "fh-hold/intent/m3", fmt.Sprintf(`{"host":"m3","lease":%d,"started":"2026-01-01T00:00:00Z"}`, intentLease.ID))
	if p := f.forget(t, "m3"); p.code != codePreflight || !strings.Contains(p.stderr.String(), "restart intent fh-hold/intent/m3 is live") {
		t.Fatalf("forget-host with m3's live restart intent: exit %d, want 3:\n%s", p.code, p.stderr)
	}
	f.srv.Put(t, "fh-hold/intent/m3", orphan)
	if _, err := f.cli.Revoke(ctx, intentLease.ID); err != nil {
		t.Fatal(err)
	}
	rev = f.revision(t) // the test's own writes of the intent
	live, _ := leaseServer(t, func(int32) map[string]time.Duration { return map[string]time.Duration{"m1": 0, "m3": time.Second} })
	if p := f.forget(t, "m3.example.com", "--kubeconfig", live); p.code != codePreflight || !strings.Contains(p.stderr.String(), "identity Lease of apiserver m3") {
		t.Fatalf("forget-host with m3's identity Lease live: exit %d, want 3 naming the Lease:\n%s", p.code, p.stderr)
	}
	if p := f.forget(t, "m1"); p.code != codePreflight || !strings.Contains(p.stderr.String(), "that is this host") {
		t.Fatalf("forget-host of this host: exit %d, want 3:\n%s", p.code, p.stderr)
	}
	if p := f.forget(t, "m9"); p.code != codePreflight || !strings.Contains(p.stderr.String(), "check the name") {
		t.Fatalf("forget-host of an unknown host: exit %d, want 3:\n%s", p.code, p.stderr)
	}
	if got := f.revision(t); got != rev {
		t.Fatalf("revision %d after the refusals, want %d: a refusal wrote", got, rev)
	}
	dead, _ := leaseServer(t, func(int32) map[string]time.Duration { return map[string]time.Duration{"m1": 0, "m3": 10 * time.Minute} })
	rev = f.revision(t)
	p := f.forget(t, "m3", "--dry-run", "--grace", "2h", "--kubeconfig", dead)
	if p.code != codeOK {
		t.Fatalf("forget-host --dry-run: exit %d:\n%s", p.code, p.stderr)
	}
	out := p.stdout.String()
	for _, want := range []string{
		"dry run: nothing written or removed",
		"would supersede key " + f.hosts["m3"].kid,
		"(--grace 2h0m0s)",
		"would mark m3 forgotten in its key record " + rotPrefix + "/m3/kept",
		"would delete trust record " + trust.DefaultPrefix + "/m3",
		"would delete rotation state " + rotPrefix + "/m3/state",
		"would delete waiting record " + rotPrefix + "/m3/waiting",
		"would delete restart intent fh-hold/intent/m3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if got := f.revision(t); got != rev {
		t.Fatalf("revision %d after --dry-run, want %d", got, rev)
	}
}

// forget-host of a dead master: its key superseded with retire time
// now+grace, its trust record, rotation state, waiting record and restart
// intent deleted, its key record kept and marked; then a wait-trusted for
// another master's new key does not wait for it, nor does the signer's
// barrier (hosts with a trust record), trust shows it gone and not stale,
// and retire-keys after the grace retires its key, deletes its value and
// trust forgets it; publish-key under the name brings it back.
func TestForgetHost(t *testing.T) {
	f := newForgetFleet(t)
	ctx := context.Background()
	m3, m4 := f.hosts["m3"], f.hosts["m4"]
	before := time.Now()
	if p := f.forget(t, "m3", "--grace", "1h"); p.code != codeOK || !strings.Contains(p.stdout.String(), "m3 forgotten") {
		t.Fatalf("forget-host m3: exit %d:\n%s\n%s", p.code, p.stdout, p.stderr)
	}
	after := time.Now()
	if p := f.forget(t, "m4", "--grace", "0s"); p.code != codeOK {
		t.Fatalf("forget-host m4: exit %d:\n%s", p.code, p.stderr)
	}
	raw, ok := getKey(t, f.cli, rotPrefix+"/m3/kept")
	if !ok {
		t.Fatal("m3's key record is gone")
	}
	var rec keystate.Record
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		t.Fatal(err)
	}
	sup, ok := rec.Superseded[m3.kid]
	if !ok || sup.RetireAfter.Before(before.Add(time.Hour).Truncate(time.Second)) || sup.RetireAfter.After(after.Add(time.Hour)) || sup.By != "forget-host" || rec.Forgotten.IsZero() {
		t.Fatalf("m3's key record %s: want its key superseded until now+1h by forget-host, and forgotten", raw)
	}
	if v, _ := getKey(t, f.cli, trust.DefaultKeysPrefix+"/m3"); v != value(t, m3.pub) {
		t.Fatalf("m3's value changed: %q", v)
	}
	for _, gone := range []string{trust.DefaultPrefix + "/m3", rotPrefix + "/m3/state", rotPrefix + "/m3/waiting", "fh-hold/intent/m3", rotPrefix + "/m3/owner"} {
		if _, ok := getKey(t, f.cli, gone); ok {
			t.Errorf("%s still there after forget-host", gone)
		}
	}
	if _, ok := getKey(t, f.cli, trust.DefaultPrefix+"/m2"); !ok {
		t.Fatal("m2's trust record went too")
	}
	// The signer's barrier waits for the hosts with a trust record.
	recorded, err := trust.CollectRecorded(ctx, f.cli, trust.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if got := recorded.NotTrustingAmong(trust.Recorded, []string{"K-new"}, nil); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("the barrier would wait for %v, want m1 and m2", got)
	}

	// m2 rotates: its next key published, trusted by m1 and m2 only.
	priv, pub := newKeyPair(t)
	next := pemKid(t, pub)
	f.srv.Put(t, trust.DefaultKeysPrefix+"/m2", value(t, f.hosts["m2"].pub, pub))
	all := []string{f.hosts["m1"].kid, f.hosts["m2"].kid, m3.kid, m4.kid, next}
	for _, n := range []string{"m1", "m2"} {
		if err := trust.Put(ctx, f.cli, trust.DefaultPrefix, "", trust.Record{Host: n, Trusted: all, Signing: f.hosts[n].kid, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	keyFile := writeFile(t, filepath.Join(t.TempDir(), "next.key"), priv)
	if p := runBin(t, f.env, "wait-trusted", "--public-key", keyFile, "--host", "m2", "--timeout", "1m"); p.code != codeOK ||
		!strings.Contains(p.stderr.String(), "trusted by every host: m1, m2") {
		t.Fatalf("wait-trusted after forget-host: exit %d, want 0 waiting for m1 and m2 only:\n%s", p.code, p.stderr)
	}

	p := runBin(t, f.env, "trust")
	if p.code != codeOK {
		t.Fatalf("trust: exit %d, want 0 (a forgotten host is not stale):\n%s\n%s", p.code, p.stdout, p.stderr)
	}
	for _, want := range []string{"GONE: removed by forget-host", "keys of m3: GONE (forget-host", "superseded " + m3.kid + " (by forget-host, retired after", "keys of m2: current "} {
		if !strings.Contains(p.stdout.String(), want) {
			t.Errorf("trust lacks %q:\n%s", want, p.stdout)
		}
	}
	if p := runBin(t, f.env, "status", "--lock-name", "fh"); p.code != codeOK || !strings.Contains(p.stdout.String(), "m3: GONE (forget-host") {
		t.Errorf("status: exit %d:\n%s\n%s", p.code, p.stdout, p.stderr)
	}

	// m4's grace (0s) is over: retire-keys on m1 retires its key, deletes
	// its value; trust forgets m4. m3's key is not due yet.
	if p := runBin(t, f.env, retireArgs(f.hosts["m1"])...); p.code != codeOK {
		t.Fatalf("retire-keys: exit %d:\n%s", p.code, p.stderr)
	}
	if v, ok := getKey(t, f.cli, trust.DefaultKeysPrefix+"/m4"); ok {
		t.Fatalf("m4's value after its last key retired: %q, want deleted", v)
	}
	if v, _ := getKey(t, f.cli, trust.DefaultKeysPrefix+"/m3"); v != value(t, m3.pub) {
		t.Fatalf("m3's value before its retire time: %q", v)
	}
	hosts := trustJSON(t, f.env)
	if _, ok := hosts["m4"]; ok {
		t.Errorf("m4 still in trust after its keys were retired: %v", hosts)
	}
	if h := hosts["m3"]; h.Forgotten == nil || len(h.Current) != 0 || len(h.Superseded) != 1 || h.Superseded[0].KID != m3.kid {
		t.Errorf("m3 in trust -o json: %+v", h)
	}

	// A new host named m4: publish-key makes it a member again; its old
	// key stays retired.
	_, pub4 := newKeyPair(t)
	pubFile := writeFile(t, filepath.Join(t.TempDir(), "m4.pub"), pub4)
	if p := runBin(t, f.env, "publish-key", "--host", "m4", "--public-key", pubFile); p.code != codeOK {
		t.Fatalf("publish-key m4: exit %d:\n%s", p.code, p.stderr)
	}
	if h := trustJSON(t, f.env)["m4"]; h.Forgotten != nil || !slices.Equal(h.Current, []string{pemKid(t, pub4)}) {
		t.Errorf("m4 after publish-key: %+v, want a member with its new key", h)
	}
}

// trustJSON is `trust -o json`'s hosts by name.
func trustJSON(t *testing.T, env []string) map[string]keystate.HostKeys {
	t.Helper()
	p := runBin(t, env, "trust", "-o", "json")
	if p.code != codeOK && p.code != codeStale {
		t.Fatalf("trust -o json: exit %d:\n%s", p.code, p.stderr)
	}
	var rep struct {
		Hosts []keystate.HostKeys `json:"hosts"`
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &rep); err != nil {
		t.Fatalf("trust -o json: %v:\n%s", err, p.stdout)
	}
	out := map[string]keystate.HostKeys{}
	for _, h := range rep.Hosts {
		out[h.Host] = h
	}
	return out
}
