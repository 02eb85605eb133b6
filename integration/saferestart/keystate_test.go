package saferestart

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/internal/trust"
)

// keyHost is one master's key files for these tests.
type keyHost struct {
	name, dir    string
	oldPub, pub  []byte // the key it published before, and its current one
	oldKid, kid  string
	signing, sap string // sa.key, sa.pub
}

func newKeyHost(t *testing.T, name string) *keyHost {
	t.Helper()
	h := &keyHost{name: name, dir: filepath.Join(t.TempDir(), name)}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, h.oldPub = newKeyPair(t)
	priv, pub := newKeyPair(t)
	h.pub = pub
	h.signing = writeFile(t, filepath.Join(h.dir, "sa.key"), priv)
	h.sap = writeFile(t, filepath.Join(h.dir, "sa.pub"), pub)
	h.oldKid = pemKid(t, h.oldPub)
	h.kid = pemKid(t, h.pub)
	return h
}

func pemKid(t *testing.T, data []byte) string {
	t.Helper()
	f, err := pemcheck.Parse("key", data)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := f.KeyIDs()
	if err != nil || len(kids) != 1 {
		t.Fatalf("key IDs %v %v", kids, err)
	}
	return kids[0]
}

// value is the published value of keys, as every writer writes it.
func value(t *testing.T, pems ...[]byte) string {
	t.Helper()
	var items []keystate.Item
	for _, p := range pems {
		it, err := keystate.ParseValue("key", p, false)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, it...)
	}
	keystate.SortItems(items)
	return string(keystate.Join(items))
}

func retireArgs(h *keyHost, more ...string) []string {
	return append([]string{"retire-keys", "--host", h.name, "--signing-key", h.signing, "--public-key", h.sap}, more...)
}

// Upgrade in place, and retire-keys from every master at once: hosts whose
// keys were kept by the older helper (a legacy `kept` record, an installed
// rotation's state, both written in the old format) keep every key
// published until the recorded time, byte for byte the value they had; a
// reimaged host's old key is superseded by publish-key; then three
// retire-keys run at the same moment on three masters: every run exits 0,
// each due key is retired exactly once (by whichever run claimed its
// host), the not-yet-due ones stay, the rotation is marked retired, and
// each master's own sa.pub loses its retired key.
func TestRetireKeysUpgradeAndConcurrentRuns(t *testing.T) {
	srv := etcdtest.Start(t)
	e := env(srv)
	ctx := context.Background()
	cli := srv.Client(t)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	m1, m2, m3, m4, m5 := newKeyHost(t, "m1"), newKeyHost(t, "m2"), newKeyHost(t, "m3"), newKeyHost(t, "m4"), newKeyHost(t, "m5")
	// m1: a certificate renewal kept its old key (legacy record, due);
	// its sa.pub still holds both.
	writeFile(t, m1.sap, []byte(value(t, m1.oldPub, m1.pub)))
	srv.Put(t, keysPrefix+"/m1", value(t, m1.oldPub, m1.pub))
	srv.Put(t, rotationPrefix+"/m1/kept", `{"host":"m1","keep":{"`+m1.oldKid+`":"`+past+`"}}`)
	// m2: reimaged: its value holds the lost key; publish-key at boot
	// supersedes it (--grace 0: due at the next retire-keys).
	srv.Put(t, keysPrefix+"/m2", value(t, m2.oldPub))
	// m3: a rotation installed by the older helper, due.
	srv.Put(t, keysPrefix+"/m3", value(t, m3.oldPub, m3.pub))
	srv.Put(t, rotationPrefix+"/m3/state", `{"host":"m3","phase":"installed","algorithm":"ecdsa-p256","previous":"`+m3.oldKid+`","next":"`+m3.kid+`","grace":"24h0m0s","retire_after":"`+past+`"}`)
	// m4 and m5: the same, not due yet.
	srv.Put(t, keysPrefix+"/m4", value(t, m4.oldPub, m4.pub))
	srv.Put(t, rotationPrefix+"/m4/kept", `{"host":"m4","keep":{"`+m4.oldKid+`":"`+future+`"}}`)
	srv.Put(t, keysPrefix+"/m5", value(t, m5.oldPub, m5.pub))
	srv.Put(t, rotationPrefix+"/m5/state", `{"host":"m5","phase":"installed","previous":"`+m5.oldKid+`","next":"`+m5.kid+`","retire_after":"`+future+`"}`)
	for _, h := range []*keyHost{m1, m2, m3, m4, m5} {
		rec := trust.Record{Host: h.name, Trusted: []string{h.oldKid, h.kid}, Signing: h.kid, Time: time.Now()}
		if err := trust.Put(ctx, cli, trust.DefaultPrefix, "", rec); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]string{}
	for _, h := range []*keyHost{m4, m5} {
		before[h.name], _ = getKey(t, cli, keysPrefix+"/"+h.name)
	}

	if p := runBin(t, e, "publish-key", "--host", "m2", "--public-key", m2.sap, "--grace", "0s"); p.code != codeOK {
		t.Fatalf("publish-key after the reimage: exit %d\n%s", p.code, p.stderr)
	}
	if got, _ := getKey(t, cli, keysPrefix+"/m2"); got != value(t, m2.oldPub, m2.pub) {
		t.Fatalf("m2's old key withdrawn by the reimage's publish-key:\n%s", got)
	}

	runs := []*proc{bin(t, e, retireArgs(m1)...), bin(t, e, retireArgs(m2)...), bin(t, e, retireArgs(m3)...)}
	retiredBy := map[string]int{}
	for _, p := range runs {
		if code := p.wait(t); code != codeOK {
			t.Fatalf("retire-keys: exit %d\n%s", code, p.stderr)
		}
		for _, h := range []*keyHost{m1, m2, m3, m4, m5} {
			retiredBy[h.oldKid] += strings.Count(p.stderr.String(), "key "+h.oldKid+" retired")
		}
	}
	for _, h := range []*keyHost{m1, m2, m3} {
		if n := retiredBy[h.oldKid]; n != 1 {
			t.Errorf("%s's old key retired %d times, want once", h.name, n)
		}
		if got, _ := getKey(t, cli, keysPrefix+"/"+h.name); got != value(t, h.pub) {
			t.Errorf("%s's value after retire-keys holds %v, want only %s", h.name, kidsOfValue(t, got), h.kid)
		}
		var rec keystate.Record
		raw, _ := getKey(t, cli, rotationPrefix+"/"+h.name+"/kept")
		if err := json.Unmarshal([]byte(raw), &rec); err != nil || rec.Retired[h.oldKid].IsZero() || len(rec.Superseded) != 0 || rec.Keep != nil {
			t.Errorf("%s's record %s (%v)", h.name, raw, err)
		}
	}
	for _, h := range []*keyHost{m4, m5} {
		if retiredBy[h.oldKid] != 0 {
			t.Errorf("%s's key retired before its recorded time", h.name)
		}
		if got, _ := getKey(t, cli, keysPrefix+"/"+h.name); got != before[h.name] {
			t.Errorf("%s's value changed by the upgrade:\n%s\nwas\n%s", h.name, got, before[h.name])
		}
	}
	if st, _ := getKey(t, cli, rotationPrefix+"/m3/state"); !strings.Contains(st, `"phase":"retired"`) {
		t.Errorf("m3's rotation not marked retired: %s", st)
	}
	if got := fileKids(t, m1.sap); !slices.Equal(got, []string{m1.kid}) {
		t.Errorf("m1's sa.pub after retire-keys holds %v, want only %s", got, m1.kid)
	}
	// m2's sa.pub never held the lost key; the tombstone keeps it from
	// coming back: a publish of it alone is refused, naming it.
	old := writeFile(t, filepath.Join(m2.dir, "old.pub"), m2.oldPub)
	if p := runBin(t, e, "publish-key", "--host", "m2", "--public-key", old); p.code != codePreflight || !strings.Contains(p.stderr.String(), m2.oldKid) {
		t.Fatalf("publish of a retired key: exit %d\n%s", p.code, p.stderr)
	}
	// --dry-run from any master shows each host's plan.
	p := runBin(t, e, retireArgs(m1, "--dry-run")...)
	if p.code != codeOK || !strings.Contains(p.stdout.String(), "m4: key "+m4.oldKid) || !strings.Contains(p.stdout.String(), "m5: key "+m5.oldKid) {
		t.Fatalf("retire-keys --dry-run: exit %d\n%s\n%s", p.code, p.stdout, p.stderr)
	}
}

func kidsOfValue(t *testing.T, v string) []string {
	t.Helper()
	items, err := keystate.ParseValue("value", []byte(v), true)
	if err != nil {
		t.Fatal(err)
	}
	return keystate.KIDs(items)
}
