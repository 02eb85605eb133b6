package rotation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// Abort before the install withdraws the next key from the file and the
// published value, removes its files and clears the state; after the
// install it is refused (ErrState), and a rollback is what remains.
func TestAbortBeforeInstall(t *testing.T) {
	for _, step := range []string{StepWait, StepRestart} {
		t.Run(step, func(t *testing.T) {
			f, r, store := newFleet(t, RSA2048)
			prev := f.signing
			ctx := context.Background()
			if err := r.Rollback(ctx); !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "nothing to roll back") {
				t.Fatalf("rollback with no rotation: %v", err)
			}
			f.fail[step] = errors.New("m3 does not trust it")
			if err := r.Run(ctx); err == nil {
				t.Fatal("run did not stop")
			}
			next := store.st.Next
			if step == StepRestart {
				// Installed already: abort is refused, rollback is the way back.
				err := r.Abort(ctx)
				if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "use rotate-key --rollback") {
					t.Fatalf("abort after the install: %v", err)
				}
				return
			}
			if err := r.Rollback(ctx); !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "use rotate-key --abort") {
				t.Fatalf("rollback before the install: %v", err)
			}
			if err := r.Abort(ctx); err != nil {
				t.Fatal(err)
			}
			if got := kidsOf(t, f.published); len(got) != 1 || got[0] != prev {
				t.Fatalf("published %v after abort, want only %s (next was %s)", got, prev, next)
			}
			if data, _ := os.ReadFile(f.files.PublicKey); string(data) != string(f.published) {
				t.Fatal("sa.pub and the published value differ")
			}
			// Nothing signed with it: retired at once, not superseded.
			if !f.keys.retired[next] || len(f.keys.superseded) != 0 {
				t.Fatalf("aborted next key %s: retired %v, superseded %v", next, f.keys.retired, f.keys.superseded)
			}
			for _, p := range []string{f.files.NextKey(), f.files.NextPub(), f.files.Backup()} {
				if exists(p) {
					t.Errorf("%s outlives the aborted rotation", p)
				}
			}
			if store.st != nil {
				t.Fatalf("state %+v after abort, want none", store.st)
			}
			if cur, _ := signingKeyID(f.files.SigningKey); cur != prev {
				t.Fatal("signing key changed")
			}
			if err := r.Abort(ctx); !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "nothing to abort") {
				t.Fatalf("second abort: %v", err)
			}
			// A new rotation starts afresh.
			if err := r.Run(ctx); err != nil || store.st.Next == next {
				t.Fatalf("rotation after abort: %v, next %s (aborted %s)", err, store.st.Next, next)
			}
		})
	}
}

// Rollback after the install: the previous key signs again after a restart
// through the lock, the rolled-back key stays published until retire-keys
// after the grace period, which then removes it and its private key.
func TestRollbackThenRetire(t *testing.T) {
	f, r, store := newFleet(t, ECDSAP256)
	prev := f.signing
	ctx := context.Background()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	next := store.st.Next
	if exists(f.files.NextPub()) || exists(f.files.NextKey()) {
		t.Fatal("sa.pub.next or sa.key.next outlives the finished rotation")
	}
	f.events = nil
	// The restart fails once: the rollback stays resumable.
	f.fail[StepRestart] = errors.New("killed")
	if err := r.Rollback(ctx); err == nil || store.st.Phase != PhaseRollingBack {
		t.Fatalf("rollback with a failed restart: %v, state %+v", err, store.st)
	}
	if err := r.Run(ctx); !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "--rollback") {
		t.Fatalf("rotate-key during a rollback: %v", err)
	}
	if err := r.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if cur, _ := signingKeyID(f.files.SigningKey); cur != prev || f.signing != prev {
		t.Fatalf("signing key %s, running %s, want the previous %s", cur, f.signing, prev)
	}
	if b, _ := signingKeyID(f.files.Backup()); b != next {
		t.Fatalf("backup holds %s, want the rolled-back key %s", b, next)
	}
	if m := mode(t, f.files.SigningKey); m != 0o600 {
		t.Fatalf("signing key mode %o", m)
	}
	if got := strings.Join(f.restarted, ","); got != next+","+prev {
		t.Fatalf("restarted to sign with %s, want the install's %s then the rollback's %s", got, next, prev)
	}
	st := store.st
	if st.Phase != PhaseInstalled || !st.RolledBack || st.Next != prev || st.Previous != next {
		t.Fatalf("state after rollback %+v", st)
	}
	if got := kidsOf(t, f.published); len(got) != 2 {
		t.Fatalf("published %v: the rolled-back key must stay published until retire-keys", got)
	}
	// The key signing again is current again; the rolled-back one is
	// superseded until the rollback's retire time.
	if got, ok := f.keys.superseded[next]; !ok || !got.Equal(st.RetireAfter) || len(f.keys.superseded) != 1 {
		t.Fatalf("superseded %v after rollback, want only %s until %s", f.keys.superseded, next, st.RetireAfter)
	}
	// retire-keys retires it: sa.pub holds only the signing key, and the
	// rolled-back private key is gone.
	f.keys.retire(t, f.files, next)
	if got := kidsOf(t, readFile(t, f.files.PublicKey)); len(got) != 1 || got[0] != prev {
		t.Fatalf("sa.pub %v after retire, want only %s", got, prev)
	}
	if exists(f.files.Backup()) {
		t.Fatal("sa.key.previous kept after its key was retired")
	}
	if err := r.Rollback(ctx); !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "was retired") {
		t.Fatalf("rollback after retire: %v", err)
	}
}

// scrub overwrites a private key before unlinking it, unless the file has
// another name (a hard link to the signing key), which it only unlinks.
func TestScrub(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "sa.key")
	other := filepath.Join(dir, "sa.key.previous")
	if err := os.WriteFile(key, []byte("SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(key, other); err != nil {
		t.Fatal(err)
	}
	if err := scrub(other, key); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(key); string(data) != "SECRET" || exists(other) {
		t.Fatalf("hard link: key %q, other exists %v", data, exists(other))
	}
	// A sole name is zeroed first: a second name opened before sees zeros.
	f, err := os.Open(key)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := scrub(key, other); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "\x00\x00\x00\x00\x00\x00" {
		t.Fatalf("content after scrub %q (%v), want zeros", buf, err)
	}
	if exists(key) {
		t.Fatal("not unlinked")
	}
}

func TestFilesCheck(t *testing.T) {
	dir := t.TempDir()
	f := Files{SigningKey: filepath.Join(dir, "sa.key"), PublicKey: filepath.Join(dir, "sa.pub")}
	err := f.Check()
	if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "signing key (--signing-key): "+f.SigningKey+": open: no such file or directory") {
		t.Fatalf("missing sa.key: %v", err)
	}
	priv, _, _ := generate(ECDSAP256)
	if err := os.WriteFile(f.SigningKey, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Check(); !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "public key (--public-key): open "+f.PublicKey) {
		t.Fatalf("missing sa.pub: %v", err)
	}
}
