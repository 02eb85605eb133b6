package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/apply"
)

// movingStore is an etcd that changes between any two reads: every read
// is at a new revision. A failing one refuses every read.
type movingStore struct {
	mu    sync.Mutex
	rev   int64
	reads int
	fail  bool
}

func (m *movingStore) GetValues(context.Context, []string) (map[string]string, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	if m.fail {
		return nil, 0, errors.New("etcd refused")
	}
	m.rev++
	return map[string]string{}, m.rev, nil
}

// revProc records the revision each of its passes saw, in order, in a log
// shared by all.
type revProc struct {
	fakeProc
	seen *[]string
}

func (p *revProc) Process(ctx context.Context, g apply.Getter) (apply.Result, error) {
	_, rev, err := g.GetValues(ctx, p.keys)
	if err != nil {
		return apply.Result{}, err
	}
	*p.seen = append(*p.seen, fmt.Sprintf("%s@%d", p.name, rev))
	return apply.Result{Revision: rev}, nil
}

// TestOnceReadsAGroupOnce: -onetime keeps file-name order across groups,
// and the members of a group (a flags file and the bundle it names) render
// from one read, while etcd moves between reads.
func TestOnceReadsAGroupOnce(t *testing.T) {
	var seen []string
	proc := func(name string, keys ...string) Processor {
		return &revProc{fakeProc: fakeProc{name: name, keys: keys}, seen: &seen}
	}
	store := &movingStore{}
	log, _ := test.NewNullLogger()
	err := Once(context.Background(), []Processor{
		proc("20-sa-bundle.toml", "/k"),
		proc("15-other.toml", "/o"),
		proc("10-flags.toml", "/k"),
		proc("30-nested.toml", "/k/m1"),
	}, store, log)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10-flags.toml@1", "15-other.toml@2", "20-sa-bundle.toml@1", "30-nested.toml@1"}
	if !slices.Equal(seen, want) || store.reads != 2 {
		t.Fatalf("passes %v after %d reads, want %v after 2", seen, store.reads, want)
	}
}

// TestOnceFailuresAndStop: a read that fails fails every member of its
// group, each named; after ctx ends nothing further starts, and each
// resource left says so.
func TestOnceFailuresAndStop(t *testing.T) {
	var seen []string
	log, _ := test.NewNullLogger()
	procs := []Processor{
		&revProc{fakeProc: fakeProc{name: "a.toml", keys: []string{"/k"}}, seen: &seen},
		&revProc{fakeProc: fakeProc{name: "b.toml", keys: []string{"/k"}}, seen: &seen},
	}
	err := Once(context.Background(), procs, &movingStore{fail: true}, log)
	var j interface{ Unwrap() []error }
	if !errors.As(err, &j) || len(j.Unwrap()) != 2 || !strings.Contains(err.Error(), "a.toml: read keys: etcd refused") ||
		!strings.Contains(err.Error(), "b.toml: read keys: etcd refused") {
		t.Fatalf("err = %v, want both resources' read failures", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	store := &movingStore{}
	err = Once(ctx, procs, store, log)
	if len(seen) != 0 || store.reads != 0 || err == nil || strings.Count(err.Error(), "not processed: confd is stopping") != 2 {
		t.Fatalf("after the stop: passes %v, %d reads, err %v", seen, store.reads, err)
	}
}
