package keywatch

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/keytest"
)

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// The tombstone file: written atomically when it changed, read back the
// same; an unwritable directory is counted and logged, never fatal, and
// a damaged file is read as empty (etcd's tombstones fill it again).
func TestTombstoneFile(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := &Watcher{StateDir: filepath.Join(dir, "state"), Log: quietLog(), Metrics: NewMetrics()}
	w.loadTombstones()
	w.remember("m1", map[string]time.Time{"kidA": at})
	if !w.unsaved || w.tombs.add("m1", map[string]time.Time{"kidA": at.Add(time.Hour)}) {
		t.Fatal("add: a new tombstone must change the set, a known one (whatever its time) must not")
	}
	w.saveTombstones(w.Log)
	back, err := readTombstones(filepath.Join(dir, "state", TombstonesFile))
	if err != nil || !back["m1"]["kidA"].Equal(at) {
		t.Fatalf("read back %v (%v), want m1's kidA at %s", back, err, at)
	}
	if got := back.missing("m1", map[string]time.Time{}); len(got) != 1 {
		t.Errorf("missing from an empty record: %v, want kidA", got)
	}

	ro := filepath.Join(dir, "ro")
	if err := os.WriteFile(ro, nil, 0o600); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	w2 := &Watcher{StateDir: filepath.Join(ro, "state"), Log: quietLog(), Metrics: NewMetrics()}
	w2.loadTombstones()
	w2.remember("m1", map[string]time.Time{"kidA": at})
	w2.saveTombstones(w2.Log)
	// Once unreadable at start, once unwritable.
	if n := errorsCounted(t, w2.Metrics, ErrStateDir); n != 2 {
		t.Errorf("unusable state dir counted %v times, want 2", n)
	}

	if err := os.WriteFile(filepath.Join(dir, "state", TombstonesFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	w3 := &Watcher{StateDir: filepath.Join(dir, "state"), Log: quietLog(), Metrics: NewMetrics()}
	w3.loadTombstones()
	if len(w3.tombs) != 0 || errorsCounted(t, w3.Metrics, ErrStateDir) != 1 {
		t.Errorf("damaged file: tombstones %v, want none and one state-dir error", w3.tombs)
	}
}

func item(t *testing.T) keystate.Item {
	k := keytest.EC(t)
	return keystate.Item{KID: keytest.KeyID(t, k.Public()), PEM: keytest.PublicPEM(t, k.Public())}
}

// Why a reconcile wrote: repairs are told from a first publish and from a
// changed key file.
func TestReasons(t *testing.T) {
	a, b := item(t), item(t)
	now := time.Now()
	st := func(items ...keystate.Item) keystate.State {
		return keystate.State{Host: "m1", Items: items, Record: keystate.Record{Host: "m1", Superseded: map[string]keystate.Superseded{}, Retired: map[string]time.Time{}}}
	}
	w := &Watcher{published: map[string]bool{}}
	publish := func(cur keystate.State, src ...keystate.Item) []string {
		next, _, err := cur.Publish(src, "test", now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return w.reasons(cur, next, src, nil)
	}
	if why := publish(st(), a); len(why) != 0 {
		t.Errorf("first publish: %v, want no repair", why)
	}
	w.published[a.KID] = true
	if why := publish(st(), a); !slices.Equal(why, []string{ValueMissing}) {
		t.Errorf("value gone: %v", why)
	}
	if why := publish(st(b), a); !slices.Equal(why, []string{CurrentMissing}) {
		t.Errorf("own key gone from the value: %v", why)
	}
	if why := publish(st(a), b); len(why) != 0 {
		t.Errorf("a new key in the file: %v, want no repair", why)
	}
	sup := st(b)
	sup.Record.Superseded[a.KID] = keystate.Superseded{RetireAfter: now, PEM: string(a.PEM)}
	if why := publish(sup, b); !slices.Equal(why, []string{SupersededMissing}) {
		t.Errorf("superseded key dropped: %v", why)
	}
	ret := st(a, b)
	ret.Record.Retired[a.KID] = now
	if why := publish(ret, b); !slices.Equal(why, []string{RetiredPresent}) {
		t.Errorf("retired key in the value: %v", why)
	}
	if d := describe([]string{ValueMissing, TombstoneMissing}); !strings.Contains(d, "gone") || !strings.Contains(d, "tombstone") {
		t.Errorf("describe: %q", d)
	}
}

// errorsCounted is the errors counter's value for kind, as scraped.
func errorsCounted(t *testing.T, m *Metrics, kind string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kube_apiserver_safe_restart_publisher_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no errors_total{kind=%q} series", kind)
	return 0
}
