package rotation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

type memStore struct{ st *State }

// memKeys is the host's key record as retire-keys and the rotation see it.
type memKeys struct {
	superseded map[string]time.Time
	retired    map[string]bool
}

func (m *memKeys) Withdraw(_ context.Context, kid string) error { m.retired[kid] = true; return nil }

func (m *memKeys) Supersede(_ context.Context, kid string, retireAfter time.Time, resumed string) error {
	if resumed != "" {
		if m.retired[resumed] {
			return errors.New("retired")
		}
		delete(m.superseded, resumed)
	}
	if _, ok := m.superseded[kid]; !ok && !m.retired[kid] {
		m.superseded[kid] = retireAfter
	}
	return nil
}

func (m *memKeys) Retired(_ context.Context, kid string) (bool, error) { return m.retired[kid], nil }

// retire is retire-keys for this host: kid tombstoned, then the owner's
// files trimmed.
func (m *memKeys) retire(t *testing.T, files Files, kid string) {
	t.Helper()
	delete(m.superseded, kid)
	m.retired[kid] = true
	log := logrus.New()
	log.Out = io.Discard
	if err := files.TrimRetired(func(k string) bool { return m.retired[k] }, log); err != nil {
		t.Fatal(err)
	}
}

func (m *memStore) Load(context.Context) (*State, error) {
	if m.st == nil {
		return nil, nil
	}
	c := *m.st
	return &c, nil
}

func (m *memStore) Save(_ context.Context, s State) error { m.st = &s; return nil }
func (m *memStore) Clear(context.Context) error           { m.st = nil; return nil }

// fleet fakes the world around one host's rotation: what it published, who
// trusts what, and which key its apiserver signs with after a restart.
type fleet struct {
	t         *testing.T
	files     Files
	published []byte
	trusted   map[string]bool // key IDs every other host trusts
	signing   string          // key ID the running apiserver signs with
	restarted []string        // key IDs signing after each successful restart
	events    []string
	keys      *memKeys
	fail      map[string]error // step → error injected once
}

func (f *fleet) failOnce(step string) error {
	if err := f.fail[step]; err != nil {
		delete(f.fail, step)
		return err
	}
	return nil
}

func newFleet(t *testing.T, algorithm string) (*fleet, *Rotator, *memStore) {
	t.Helper()
	dir := t.TempDir()
	files := Files{SigningKey: filepath.Join(dir, "sa.key"), PublicKey: filepath.Join(dir, "sa.pub")}
	priv, pub, err := generate(RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files.SigningKey, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files.PublicKey, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	cur, err := signingKeyID(files.SigningKey)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, files: files, published: pub, trusted: map[string]bool{cur: true}, signing: cur, fail: map[string]error{},
		keys: &memKeys{superseded: map[string]time.Time{}, retired: map[string]bool{}}}
	store := &memStore{}
	log := logrus.New()
	log.Out = io.Discard
	r := &Rotator{
		Host: "m1", Files: files, Algorithm: algorithm, Grace: time.Hour, Store: store, Log: log,
		Publish: func(_ context.Context, v []byte) error {
			if err := f.failOnce(StepPublish); err != nil {
				return err
			}
			f.published = append([]byte(nil), v...)
			f.events = append(f.events, StepPublish)
			// Every host loads what is published (their confd and restarts).
			ids := kidsOf(t, v)
			f.trusted = map[string]bool{}
			for _, id := range ids {
				f.trusted[id] = true
			}
			return nil
		},
		WaitTrusted: func(_ context.Context, kid string) error {
			if err := f.failOnce(StepWait); err != nil {
				return err
			}
			if !f.trusted[kid] {
				return errors.New("timeout: m2 does not trust " + kid)
			}
			f.events = append(f.events, StepWait)
			return nil
		},
		Restart: func(context.Context) error {
			if err := f.failOnce(StepRestart); err != nil {
				return err
			}
			s, err := signingKeyID(files.SigningKey)
			if err != nil {
				t.Fatal(err)
			}
			if !f.trusted[s] {
				t.Errorf("restart with signing key %s that not every host trusts", s)
			}
			f.signing = s
			f.restarted = append(f.restarted, s)
			f.events = append(f.events, StepRestart)
			return nil
		},
		Keys: f.keys,
	}
	return f, r, store
}

func kidsOf(t *testing.T, v []byte) []string {
	t.Helper()
	bs, err := publicBlocks("value", v)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, b := range bs {
		out = append(out, b.KID)
	}
	return out
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestRotateThenRetire(t *testing.T) {
	for _, alg := range []string{RSA2048, ECDSAP256} {
		t.Run(alg, func(t *testing.T) {
			f, r, store := newFleet(t, alg)
			prev := f.signing
			ctx := context.Background()
			if err := r.Run(ctx); err != nil {
				t.Fatal(err)
			}
			st := store.st
			if st.Phase != PhaseInstalled || st.Previous != prev || st.Next == prev || st.Next != f.signing {
				t.Fatalf("state %+v, signing %s", st, f.signing)
			}
			if got := strings.Join(f.events, ","); got != "publish,wait-trusted,restart" {
				t.Fatalf("events %s", got)
			}
			if got := kidsOf(t, f.published); len(got) != 2 || got[0] != prev || got[1] != st.Next {
				t.Fatalf("published %v, want previous then next", got)
			}
			if m := mode(t, f.files.SigningKey); m != 0o600 {
				t.Fatalf("signing key mode %o", m)
			}
			if m := mode(t, f.files.Backup()); m != 0o600 {
				t.Fatalf("backup mode %o", m)
			}
			if b, _ := signingKeyID(f.files.Backup()); b != prev {
				t.Fatalf("backup holds %s, want the previous key %s", b, prev)
			}
			if !st.RetireAfter.Equal(st.Installed.Add(time.Hour)) {
				t.Fatalf("retire after %v, installed %v", st.RetireAfter, st.Installed)
			}
			// A re-run is a no-op.
			f.events = nil
			if err := r.Run(ctx); err != nil || len(f.events) != 0 {
				t.Fatalf("re-run: %v, events %v", err, f.events)
			}
			// The previous key is superseded until the rotation's retire
			// time, whatever a re-run does.
			if got := f.keys.superseded[prev]; !got.Equal(st.RetireAfter) || len(f.keys.superseded) != 1 {
				t.Fatalf("superseded %v, want %s until %s", f.keys.superseded, prev, st.RetireAfter)
			}
			// retire-keys (any master) retires it; the owner's files follow.
			f.keys.retire(t, f.files, prev)
			if got := kidsOf(t, readFile(t, f.files.PublicKey)); len(got) != 1 || got[0] != st.Next {
				t.Fatalf("sa.pub after retire %v, want only %s", got, st.Next)
			}
			if exists(f.files.Backup()) {
				t.Fatal("sa.key.previous kept after its key was retired")
			}
		})
	}
}

// A rotation interrupted at each step continues on a re-run, never signs
// with a key some host does not trust, and ends with the same result.
func TestRotateResumesAfterEachFailure(t *testing.T) {
	for _, step := range []string{StepPublish, StepWait, StepRestart} {
		t.Run(step, func(t *testing.T) {
			f, r, store := newFleet(t, RSA2048)
			f.fail[step] = errors.New("killed")
			ctx := context.Background()
			err := r.Run(ctx)
			if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("rotate-key step %q: ", step)) {
				t.Fatalf("first run: %v, want a failure at %s", err, step)
			}
			next := store.st.Next
			if step != StepRestart && f.signing != store.st.Previous {
				t.Fatal("signing key changed before the restart step")
			}
			if err := r.Run(ctx); err != nil {
				t.Fatalf("re-run: %v", err)
			}
			if store.st.Phase != PhaseInstalled || store.st.Next != next || f.signing != next {
				t.Fatalf("after re-run: state %+v signing %s, want the same next key %s installed", store.st, f.signing, next)
			}
		})
	}
}

// Not every host trusts the next key: nothing is installed.
func TestRotateWaitTimeoutInstallsNothing(t *testing.T) {
	f, r, store := newFleet(t, RSA2048)
	prev := f.signing
	r.WaitTrusted = func(context.Context, string) error { return errors.New("m3 does not trust it") }
	err := r.Run(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("rotate-key step %q: ", StepWait)) || !strings.Contains(err.Error(), "m3") {
		t.Fatalf("run: %v", err)
	}
	if cur, _ := signingKeyID(f.files.SigningKey); cur != prev || f.signing != prev {
		t.Fatal("signing key installed although not every host trusts it")
	}
	if store.st.Phase != PhasePublished {
		t.Fatalf("phase %s, want published", store.st.Phase)
	}
	if _, err := os.Stat(f.files.Backup()); !os.IsNotExist(err) {
		t.Fatal("backup written although nothing was installed")
	}
}

// A crash between generating the files and saving the state (or files lost
// before publishing) regenerates; after the install, the rename is not redone.
func TestRotateIdempotentFiles(t *testing.T) {
	f, r, store := newFleet(t, ECDSAP256)
	ctx := context.Background()
	f.fail[StepPublish] = errors.New("killed")
	_ = r.Run(ctx)
	first := store.st.Next
	if err := os.Remove(f.files.NextKey()); err != nil {
		t.Fatal(err)
	}
	f.fail[StepPublish] = errors.New("killed")
	_ = r.Run(ctx)
	if store.st.Next == first || store.st.Phase != PhaseGenerated {
		t.Fatalf("lost next key before publishing: state %+v, want a new key", store.st)
	}
	// Killed after the install's rename, before the restart.
	f.fail[StepRestart] = errors.New("killed")
	_ = r.Run(ctx)
	if cur, _ := signingKeyID(f.files.SigningKey); cur != store.st.Next {
		t.Fatal("not installed")
	}
	if err := r.Run(ctx); err != nil {
		t.Fatalf("re-run after install: %v", err)
	}
	if b, _ := signingKeyID(f.files.Backup()); b != store.st.Previous {
		t.Fatal("the backup was overwritten by the re-run")
	}
}

// The owner's files never lose the signing key: a backup that holds it,
// or a public key file of retired keys only, is left alone.
func TestTrimNeverDropsTheSigningKey(t *testing.T) {
	f, r, store := newFleet(t, RSA2048)
	ctx := context.Background()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	// The backup holds the signing key (restored by hand, say).
	data := readFile(t, f.files.SigningKey)
	if err := os.WriteFile(f.files.Backup(), data, 0o600); err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.Out = io.Discard
	all := func(string) bool { return true }
	if err := f.files.TrimRetired(all, log); err == nil || !exists(f.files.Backup()) {
		t.Fatalf("trim with the signing key retired: %v", err)
	}
	if got := kidsOf(t, readFile(t, f.files.PublicKey)); len(got) != 2 {
		t.Fatalf("sa.pub emptied: %v (state %+v)", got, store.st)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestPlanShowsSteps(t *testing.T) {
	_, r, _ := newFleet(t, RSA2048)
	lines, err := r.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(lines, "\n")
	for _, want := range []string{"would  generate", "would  publish", "would  wait-trusted", "would  install", "would  restart", "record-grace"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan lacks %q:\n%s", want, text)
		}
	}
	if _, err := os.Stat(r.Files.NextKey()); !os.IsNotExist(err) {
		t.Fatal("plan wrote a file")
	}
}

func TestUnknownAlgorithm(t *testing.T) {
	if _, _, err := generate("dsa"); err == nil || !strings.Contains(err.Error(), "--algorithm") {
		t.Fatalf("err %v", err)
	}
}
