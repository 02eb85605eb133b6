package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/etcdtest"
)

// collect runs Watch until it returns and sends what it delivered.
func collect(ctx context.Context, c *Client, keys []string, after int64) (<-chan backends.WatchEvent, <-chan error) {
	evs := make(chan backends.WatchEvent, 100)
	errc := make(chan error, 1)
	go func() { errc <- c.Watch(ctx, keys, after, func(e backends.WatchEvent) { evs <- e }) }()
	return evs, errc
}

func nextKeys(t *testing.T, evs <-chan backends.WatchEvent, errc <-chan error) backends.WatchEvent {
	t.Helper()
	for {
		select {
		case err := <-errc:
			t.Fatalf("watch ended: %v", err)
		case e := <-evs:
			if len(e.Keys) > 0 {
				return e
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no event")
		}
	}
}

// TestWatchExactRanges: a least-privilege user granted exactly its keys
// (the key and "key/") watches two sibling prefixes on one stream, hears
// only them (never "/a/foobar"), and resumes from Resume.
func TestWatchExactRanges(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			s := etcdtest.Start(t, etcdtest.WithVersion(v))
			s.EnableAuthExact(t, "rootpw", "reader", "pw", "/a/foo")
			put := func(k, val string) int64 { return s.PutAs(t, "root", "rootpw", k, val) }
			c := connect(t, Config{Nodes: []string{s.Endpoint}, Username: "reader", Password: "pw"})
			c.StallTimeout = 1500 * time.Millisecond // probes every 0.5 s
			after := put("/a/foo/init", "x")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			evs, errc := collect(ctx, c, []string{"/a/foo", "/a/foo/sub"}, after)
			put("/a/foobar", "not watched")
			want := put("/a/foo/x", "1")
			e := nextKeys(t, evs, errc)
			if !slices.Equal(e.Keys, []string{"/a/foo/x"}) || e.Revision != want {
				t.Fatalf("event %+v, want /a/foo/x at %d", e, want)
			}
			// The role refuses the one range of "/a/foo" (it would cover
			// "/a/foobar"), so the key is two ranges, in no common order.
			if e.Whole != "" {
				t.Errorf("Whole = %q for a key watched as two ranges", e.Whole)
			}
			// Progress answers keep coming while nothing changes.
			deadline := time.After(10 * time.Second)
			for progress := 0; progress < 3; {
				select {
				case e := <-evs:
					if len(e.Keys) == 0 && e.Resume >= want {
						progress++
					}
				case err := <-errc:
					t.Fatalf("watch ended: %v", err)
				case <-deadline:
					t.Fatal("no progress answers")
				}
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
		})
	}
}

// TestWatchWholeRange: a user allowed the wider range watches a key as one
// range, filtered back to the key: changes to the key and below it come in
// one ordered stream with their values; "/b/foo.bak", inside the range, and
// "/b/foobar", outside it, are never heard.
func TestWatchWholeRange(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			s := etcdtest.Start(t, etcdtest.WithVersion(v))
			cli := s.Client(t)
			c := connect(t, Config{Nodes: []string{s.Endpoint}})
			after := s.Put(t, "/b/foo/init", "x")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			evs, errc := collect(ctx, c, []string{"/b/foo"}, after)
			s.Put(t, "/b/foobar", "not watched")
			tx, err := cli.Txn(ctx).Then(
				clientv3.OpPut("/b/foo/x", "1"),
				clientv3.OpPut("/b/foo", "top"),
				clientv3.OpPut("/b/foo.bak", "not watched"),
				clientv3.OpDelete("/b/foo/init"),
			).Commit()
			if err != nil {
				t.Fatal(err)
			}
			rev := tx.Header.Revision
			e := nextKeys(t, evs, errc)
			want := []backends.Change{
				{Key: "/b/foo/x", Value: "1", Rev: rev},
				{Key: "/b/foo", Value: "top", Rev: rev},
				{Key: "/b/foo/init", Rev: rev, Deleted: true},
			}
			if !slices.Equal(e.Changes, want) || e.Whole != "/b/foo" || e.Revision != rev {
				t.Fatalf("event %+v,\nwant changes %+v, Whole /b/foo, revision %d", e, want, rev)
			}
			if !slices.Equal(e.Keys, []string{"/b/foo/x", "/b/foo", "/b/foo/init"}) {
				t.Errorf("Keys = %q", e.Keys)
			}
		})
	}
}

// TestWatchQuietEtcdIsNotStalled: etcd 3.6 answers no progress request
// while a watcher's next revision is above its own, as afterRev+1 is until
// the next write anywhere, so on a quiet etcd a watch from there took the
// silence for a stall, and again after every reconnect. The watch starts
// at afterRev (dropping its changes, delivered before), so progress
// requests are answered, and it still hears the next change; also for a
// least-privilege role granting exactly the key and "key/".
func TestWatchQuietEtcdIsNotStalled(t *testing.T) {
	for _, v := range etcdtest.Versions {
		for _, exact := range []bool{false, true} {
			name := v
			if exact {
				name += "/least-privilege"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := etcdtest.Start(t, etcdtest.WithVersion(v))
				cfg := Config{Nodes: []string{s.Endpoint}}
				put := func(k, val string) int64 { return s.Put(t, k, val) }
				if exact {
					s.EnableAuthExact(t, "rootpw", "reader", "pw", "/q")
					cfg.Username, cfg.Password = "reader", "pw"
					put = func(k, val string) int64 { return s.PutAs(t, "root", "rootpw", k, val) }
				}
				c := connect(t, cfg)
				c.StallTimeout = 1500 * time.Millisecond // probes every 0.5 s
				probes := make(chan struct{}, 1)
				c.afterProbe = func() {
					select {
					case probes <- struct{}{}:
					default:
					}
				}
				after := put("/q/k", "1")
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				evs, errc := collect(ctx, c, []string{"/q"}, after)
				// A stall is three probes without an answer: ten probes
				// are more than three times that.
				for i := 0; i < 10; i++ {
					select {
					case err := <-errc:
						t.Fatalf("watch of a quiet etcd ended after %d probes: %v", i, err)
					case <-probes:
					case <-time.After(20 * time.Second):
						t.Fatalf("no probe %d", i)
					}
				}
				want := put("/q/k", "2")
				if e := nextKeys(t, evs, errc); !slices.Equal(e.Keys, []string{"/q/k"}) || e.Revision != want {
					t.Fatalf("event %+v, want /q/k at %d", e, want)
				}
			})
		}
	}
}

// TestWatchFailures: compaction, a revision gone back, and a stalled
// server each end the watch with their own error.
func TestWatchFailures(t *testing.T) {
	s := etcdtest.Start(t)
	cli := s.Client(t)
	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	c.StallTimeout = 600 * time.Millisecond
	ctx := context.Background()

	first := s.Put(t, "/w/k", "1")
	s.Put(t, "/w/k", "2")
	last := s.Put(t, "/w/k", "3")
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	if err := c.Watch(ctx, []string{"/w/k"}, first, func(backends.WatchEvent) {}); !errors.Is(err, backends.ErrCompacted) {
		t.Errorf("compacted: err = %v, want backends.ErrCompacted", err)
	}

	var behind *backends.RevisionBehindError
	if err := c.Watch(ctx, []string{"/w/k"}, last+100, func(backends.WatchEvent) {}); !errors.As(err, &behind) || behind.Current != last {
		t.Errorf("future revision: err = %v, want backends.RevisionBehindError at %d", err, last)
	}

	_, errc := collect(ctx, c, []string{"/w/k"}, last)
	s.Pause()
	defer s.Resume()
	select {
	case err := <-errc:
		if !errors.Is(err, backends.ErrStalled) {
			t.Errorf("paused server: err = %v, want backends.ErrStalled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a paused server went unnoticed")
	}
}

// TestWatchManyRangesOneStream: 10,000 keys open as a few ranges on one
// stream with a fixed number of goroutines (a range per key, clientv3's
// Watcher runs a goroutine for each and opens them one at a time), and a
// change to the first and to the last key is heard.
func TestWatchManyRangesOneStream(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			s := etcdtest.Start(t, etcdtest.WithVersion(v))
			c := connect(t, Config{Nodes: []string{s.Endpoint}})
			const n = 10000
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("/many/k%04d", i)
			}
			after := s.Put(t, "/many/init", "x")
			before := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			evs, errc := collect(ctx, c, keys, after)
			for _, k := range []string{keys[0], keys[n-1]} {
				want := s.Put(t, k, "1")
				if e := nextKeys(t, evs, errc); !slices.Equal(e.Keys, []string{k}) || e.Revision != want {
					t.Fatalf("event %+v, want %s at %d", e, k, want)
				}
			}
			if grown := runtime.NumGoroutine() - before; grown > 30 {
				t.Errorf("%d more goroutines with %d ranges open", grown, n)
			}
		})
	}
}

// TestWatchLateProgressIsNoStall: an etcd that answers nothing for longer
// than the old fixed threshold (4 s), as during a defrag, but less than
// the stall timeout keeps its watch: no error, no reconnect (the same
// stream hears the next change). With a stall timeout of 4 s, the same
// pause ends the watch with backends.ErrStalled.
func TestWatchLateProgressIsNoStall(t *testing.T) {
	s := etcdtest.Start(t)
	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	c.StallTimeout = 12 * time.Second
	probes := make(chan struct{}, 16)
	c.afterProbe = func() {
		select {
		case probes <- struct{}{}:
		default:
		}
	}
	after := s.Put(t, "/late/k", "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs, errc := collect(ctx, c, []string{"/late"}, after)
	// Answered progress first: the watch is open and synced.
	for answered := false; !answered; {
		select {
		case e := <-evs:
			answered = len(e.Keys) == 0 && e.Resume >= after
		case err := <-errc:
			t.Fatalf("watch ended: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("no progress answer")
		}
	}
	s.Pause()
	paused := time.Now()
	// Silent for more than 4 s, counted by the probes that go unanswered.
	for time.Since(paused) < 5*time.Second {
		select {
		case <-probes:
		case err := <-errc:
			s.Resume()
			t.Fatalf("watch ended after %s of silence, within its stall timeout: %v", time.Since(paused).Round(time.Millisecond), err)
		case <-time.After(20 * time.Second):
			s.Resume()
			t.Fatal("no probe")
		}
	}
	s.Resume()
	want := s.Put(t, "/late/k", "2")
	if e := nextKeys(t, evs, errc); !slices.Equal(e.Keys, []string{"/late/k"}) || e.Revision != want {
		t.Fatalf("event %+v, want /late/k at %d", e, want)
	}
}

// TestWatchLostConnectionEndsAtOnce: a lost connection ends the watch
// (for the daemon to log, count, and resume) long before the stall
// timeout, although clientv3 would reconnect silently.
func TestWatchLostConnectionEndsAtOnce(t *testing.T) {
	s := etcdtest.Start(t)
	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	c.StallTimeout = time.Hour
	after := s.Put(t, "/lost/k", "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs, errc := collect(ctx, c, []string{"/lost"}, after)
	s.Put(t, "/lost/k", "2")
	nextKeys(t, evs, errc)
	s.Stop()
	select {
	case err := <-errc:
		if errors.Is(err, backends.ErrStalled) || !strings.Contains(err.Error(), "connection lost") {
			t.Errorf("err = %v, want a lost connection", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a stopped etcd went unnoticed")
	}
}

// TestWatchWideRanges: beyond maxRanges, keys below one directory are
// watched as it; each change reaches the key it is below, whole and in
// order, and a change in the directory below none of them is dropped.
func TestWatchWideRanges(t *testing.T) {
	s := etcdtest.Start(t)
	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	c.maxRanges = 2
	keys := []string{"/wide/a/1", "/wide/a/2", "/wide/a/3", "/other/x"}
	after := s.Put(t, "/wide/a/init", "x")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs, errc := collect(ctx, c, keys, after)
	s.Put(t, "/wide/a/unwatched", "dropped")
	s.Put(t, "/wide/a/10", "dropped")
	cli := s.Client(t)
	tx, err := cli.Txn(ctx).Then(clientv3.OpPut("/wide/a/2/x", "b"), clientv3.OpPut("/wide/a/1", "a"), clientv3.OpPut("/wide/a/2", "c")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	rev := tx.Header.Revision
	got := map[string][]backends.Change{}
	for len(got) < 2 {
		e := nextKeys(t, evs, errc)
		if e.Revision != rev || got[e.Whole] != nil {
			t.Fatalf("event %+v", e)
		}
		got[e.Whole] = e.Changes
	}
	if want := []backends.Change{{Key: "/wide/a/1", Value: "a", Rev: rev}}; !slices.Equal(got["/wide/a/1"], want) {
		t.Errorf("/wide/a/1 heard %+v", got["/wide/a/1"])
	}
	if want := []backends.Change{{Key: "/wide/a/2/x", Value: "b", Rev: rev}, {Key: "/wide/a/2", Value: "c", Rev: rev}}; !slices.Equal(got["/wide/a/2"], want) {
		t.Errorf("/wide/a/2 heard %+v", got["/wide/a/2"])
	}
	want := s.Put(t, "/other/x", "o")
	if e := nextKeys(t, evs, errc); !slices.Equal(e.Keys, []string{"/other/x"}) || e.Revision != want || e.Whole != "/other/x" {
		t.Fatalf("event %+v, want /other/x at %d", e, want)
	}
}

// BenchmarkWatchOpen: from Watch to the change of the last of n keys
// (idle-bench shape: one key on each of n prefixes), which is heard once
// its range is open, with keys merged beyond maxRanges ("merged") and
// with every key a range of its own ("per-key", clientv3 opening them one
// at a time). Run with -benchtime=1x: each opens n ranges.
func BenchmarkWatchOpen(b *testing.B) {
	s := etcdtest.Start(b)
	c := connect(b, Config{Nodes: []string{s.Endpoint}, RequestTimeout: time.Minute})
	for _, n := range []int{1000, 10000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("/open/p%05d/v", i)
		}
		for _, mode := range []string{"merged", "per-key"} {
			b.Run(fmt.Sprintf("%d/%s", n, mode), func(b *testing.B) {
				c.maxRanges = maxRanges
				if mode == "per-key" {
					c.maxRanges = n + 1
				}
				for b.Loop() {
					after := s.Put(b, "/open/init", "x")
					ctx, cancel := context.WithCancel(context.Background())
					evs, errc := collect(ctx, c, keys, after)
					want := s.Put(b, keys[n-1], "1")
					for heard := false; !heard; {
						select {
						case e := <-evs:
							heard = e.Revision == want && len(e.Keys) > 0
						case err := <-errc:
							b.Fatalf("watch ended: %v", err)
						case <-time.After(5 * time.Minute):
							b.Fatal("not heard")
						}
					}
					cancel()
					<-errc
				}
			})
		}
	}
}
