package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysync/confd/resource"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// fakeProc fails its first failures passes, then renders at the store's revision.
type fakeProc struct {
	keys     []string
	failures int
	calls    int
	store    *fakeStore
}

func (p *fakeProc) StoreKeys() []string { return p.keys }

func (p *fakeProc) Process(ctx context.Context, _ resource.Getter) (resource.Result, error) {
	p.calls++
	if p.calls <= p.failures {
		return resource.Result{}, errors.New("render failed")
	}
	return resource.Result{Revision: p.store.current()}, nil
}

// fakeStore answers each WatchPrefix with the next scripted revision and
// records where every watch started.
type fakeStore struct {
	mu      sync.Mutex
	rev     int64
	script  []watchAnswer
	starts  []int64
	prefix  []string
	drained chan struct{}
}

type watchAnswer struct {
	rev int64 // the store's revision after the event
	err error
}

func (s *fakeStore) current() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

func (s *fakeStore) GetValues(context.Context, []string) (map[string]string, int64, error) {
	return nil, s.current(), nil
}

func (s *fakeStore) WatchPrefix(ctx context.Context, prefix string, _ []string, afterRev int64) (int64, error) {
	s.mu.Lock()
	s.starts = append(s.starts, afterRev)
	s.prefix = append(s.prefix, prefix)
	if len(s.script) == 0 {
		s.mu.Unlock()
		close(s.drained)
		<-ctx.Done()
		return 0, ctx.Err()
	}
	a := s.script[0]
	s.script = s.script[1:]
	s.rev = a.rev
	s.mu.Unlock()
	return a.rev, a.err
}

func TestWatchResumesFromProcessedRevision(t *testing.T) {
	store := &fakeStore{rev: 10, drained: make(chan struct{}), script: []watchAnswer{
		{rev: 12},                               // a change: re-render at 12
		{rev: 15, err: errors.New("compacted")}, // a watch error: re-read everything (at 15)
		{rev: 20},                               // a burst ending at 20: rendered once
	}}
	p := &fakeProc{keys: []string{"/app/a", "/app/b"}, failures: 1, store: store}
	ctx, cancel := context.WithCancel(context.Background())
	log, hook := test.NewNullLogger()
	done := make(chan struct{})
	go func() { watchOne(ctx, p, store, log, time.Millisecond); close(done) }()
	<-store.drained
	cancel()
	<-done
	// The first render failed and was retried before any watch started.
	want := []int64{10, 12, 15, 20}
	if len(store.starts) != len(want) {
		t.Fatalf("watch starts = %v, want %v", store.starts, want)
	}
	for i := range want {
		if store.starts[i] != want[i] {
			t.Fatalf("watch starts = %v, want %v", store.starts, want)
		}
	}
	if store.prefix[0] != "/app/" {
		t.Errorf("watch prefix = %q, want the keys' common prefix", store.prefix[0])
	}
	if p.calls != 5 { // 1 failed + initial + 3 after watch answers
		t.Errorf("Process calls = %d, want 5", p.calls)
	}
	var sawErr, sawWarn bool
	for _, e := range hook.AllEntries() {
		sawErr = sawErr || (e.Level == logrus.ErrorLevel && e.Message == "render failed")
		sawWarn = sawWarn || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, "compacted"))
	}
	if !sawErr || !sawWarn {
		t.Errorf("logged render failure %v, watch error %v", sawErr, sawWarn)
	}
}

func TestOnceReportsEveryFailure(t *testing.T) {
	store := &fakeStore{rev: 1}
	good := &fakeProc{store: store}
	bad1 := &fakeProc{store: store, failures: 1}
	bad2 := &fakeProc{store: store, failures: 1}
	log, hook := test.NewNullLogger()
	err := Once(context.Background(), []Processor{bad1, good, bad2}, store, log)
	if err == nil || len(hook.AllEntries()) != 2 || good.calls != 1 {
		t.Fatalf("err %v, %d log lines, good processed %d times", err, len(hook.AllEntries()), good.calls)
	}
}

func TestCommonPrefix(t *testing.T) {
	tests := []struct {
		keys []string
		want string
	}{
		{nil, "/"},
		{[]string{"/a/b"}, "/a/b"},
		{[]string{"/app/x", "/app/y"}, "/app/"},
		{[]string{"/a", "/b"}, "/"},
		{[]string{"/foo", "/foobar"}, "/foo"},
		{[]string{"x", "y"}, "/"},
	}
	for _, tc := range tests {
		if got := commonPrefix(tc.keys); got != tc.want {
			t.Errorf("commonPrefix(%q) = %q, want %q", tc.keys, got, tc.want)
		}
	}
}
