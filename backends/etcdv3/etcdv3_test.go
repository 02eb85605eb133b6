package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/internal/etcdtest"
)

func connect(t testing.TB, cfg Config) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func getValues(t *testing.T, c *Client, keys ...string) (map[string]string, int64) {
	t.Helper()
	vals, rev, err := c.GetValues(context.Background(), keys)
	if err != nil {
		t.Fatalf("GetValues(%q): %v", keys, err)
	}
	return vals, rev
}

func currentRev(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), "\x00", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func TestGetValuesPathRule(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	var last int64
	for _, kv := range [][2]string{
		{"/foo", "1"}, {"/foo/a", "2"}, {"/foo/b/c", "3"},
		{"/foobar", "x"}, {"/foobar/y", "z"}, {"/fo", "no"}, {"/other", "o"},
	} {
		last = s.Put(t, kv[0], kv[1])
	}
	// A bare host:port, as confd accepted: http is implied.
	c := connect(t, Config{Nodes: []string{strings.TrimPrefix(s.Endpoint, "http://")}})
	for _, tc := range []struct {
		name string
		keys []string
		want map[string]string
	}{
		{"key and below, not /foobar", []string{"/foo"}, map[string]string{"/foo": "1", "/foo/a": "2", "/foo/b/c": "3"}},
		{"trailing slash: below only", []string{"/foo/"}, map[string]string{"/foo/a": "2", "/foo/b/c": "3"}},
		{"leaf", []string{"/foo/a"}, map[string]string{"/foo/a": "2"}},
		{"several, overlapping", []string{"/foo/b", "/foobar", "/foo/b/c"}, map[string]string{"/foo/b/c": "3", "/foobar": "x", "/foobar/y": "z"}},
		{"root: everything", []string{"/"}, map[string]string{
			"/foo": "1", "/foo/a": "2", "/foo/b/c": "3", "/foobar": "x", "/foobar/y": "z", "/fo": "no", "/other": "o",
		}},
		{"missing", []string{"/nothing"}, map[string]string{}},
		{"no keys", nil, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rev := getValues(t, c, tc.keys...)
			if !maps.Equal(got, tc.want) {
				t.Errorf("GetValues(%q) = %v, want %v", tc.keys, got, tc.want)
			}
			if rev != last {
				t.Errorf("revision = %d, want %d (the last put)", rev, last)
			}
		})
	}
}

// TestGetValuesManyKeysOneRevision requests more keys than fit in one
// transaction and rewrites all of them between the first transaction and
// the next: every value must still be the one at the first's revision.
func TestGetValuesManyKeysOneRevision(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	const n = 300 // 600 reads: 5 transactions
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("/many/%03d", i)
	}
	putAll := func(value string) {
		t.Helper()
		for start := 0; start < n; start += 100 {
			var ops []clientv3.Op
			for _, k := range keys[start : start+100] {
				ops = append(ops, clientv3.OpPut(k, value+k))
			}
			if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	putAll("old")
	before := currentRev(t, cli)

	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	batches := 0
	c.afterBatch = func(attempt, batch int, _ int64) {
		batches++
		if batch == 0 {
			putAll("new")
		}
	}
	got, rev := getValues(t, c, keys...)
	if rev != before {
		t.Errorf("revision = %d, want %d", rev, before)
	}
	if batches != 5 {
		t.Errorf("%d transactions, want 5", batches)
	}
	if len(got) != n {
		t.Errorf("%d keys returned, want %d", len(got), n)
	}
	for _, k := range keys {
		if got[k] != "old"+k {
			t.Fatalf("%s = %q, want %q: not read at revision %d", k, got[k], "old"+k, rev)
		}
	}
	// The same snapshot etcd itself gives at that revision.
	resp, err := cli.Get(context.Background(), "/many/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	atRev := make(map[string]string)
	for _, kv := range resp.Kvs {
		atRev[string(kv.Key)] = string(kv.Value)
	}
	if !maps.Equal(got, atRev) {
		t.Error("GetValues differs from a Get at its revision")
	}

	c.afterBatch = nil
	got, rev = getValues(t, c, keys...)
	if rev != currentRev(t, cli) || got[keys[n-1]] != "new"+keys[n-1] || len(got) != n {
		t.Errorf("second read at %d: %d keys, last %q", rev, len(got), got[keys[n-1]])
	}
}

func TestGetValuesRetriesAfterCompaction(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	keys := make([]string, 100) // 200 reads: 2 transactions
	for i := range keys {
		keys[i] = fmt.Sprintf("/c/%03d", i)
		s.Put(t, keys[i], "v")
	}
	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	compactAfterFirst := func(attempt, batch int, _ int64) {
		if batch != 0 {
			return
		}
		rev := s.Put(t, "/c/000", fmt.Sprintf("attempt %d", attempt))
		if _, err := cli.Compact(context.Background(), rev); err != nil {
			t.Fatal(err)
		}
	}

	var attempts []int
	c.afterBatch = func(attempt, batch int, _ int64) {
		if batch == 0 {
			attempts = append(attempts, attempt)
		}
		if attempt == 1 {
			compactAfterFirst(attempt, batch, 0)
		}
	}
	got, rev := getValues(t, c, keys...)
	if len(attempts) != 2 {
		t.Errorf("attempts %v, want a second after the compaction", attempts)
	}
	if len(got) != len(keys) || got["/c/000"] != "attempt 1" || rev != currentRev(t, cli) {
		t.Errorf("after retry: %d keys, /c/000 = %q, revision %d", len(got), got["/c/000"], rev)
	}

	// Compacted every time: bounded, and the error says why.
	c.afterBatch = compactAfterFirst
	_, _, err := c.GetValues(context.Background(), keys)
	if !errors.Is(err, rpctypes.ErrCompacted) || !strings.Contains(err.Error(), "/c/000") {
		t.Errorf("err = %v, want compaction error naming the keys", err)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t, etcdtest.WithTLS())
	s.Put(t, "/tls/k", "v")
	hostPort := strings.TrimPrefix(s.Endpoint, "https://")

	t.Run("client certificate", func(t *testing.T) {
		// Bare host:port: the TLS files imply https.
		c := connect(t, Config{Nodes: []string{hostPort}, ClientCAKeys: s.TLS.CA, ClientCert: s.TLS.ClientCert, ClientKey: s.TLS.ClientKey})
		if got, _ := getValues(t, c, "/tls"); got["/tls/k"] != "v" {
			t.Errorf("GetValues = %v", got)
		}
	})

	t.Run("insecure", func(t *testing.T) {
		c := connect(t, Config{Nodes: []string{s.Endpoint}, ClientInsecure: true, ClientCert: s.TLS.ClientCert, ClientKey: s.TLS.ClientKey})
		if got, _ := getValues(t, c, "/tls"); got["/tls/k"] != "v" {
			t.Errorf("GetValues = %v", got)
		}
	})

	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"untrusted client certificate",
			Config{ClientCAKeys: s.TLS.CA, ClientCert: s.TLS.UntrustedClientCert, ClientKey: s.TLS.UntrustedClientKey},
			[]string{"TLS", "client certificate"}},
		{"no client certificate", Config{ClientCAKeys: s.TLS.CA}, []string{"TLS", "client certificate"}},
		// The operator reads which CAs were used and the setting to fix.
		{"unknown server CA", Config{ClientCert: s.TLS.ClientCert, ClientKey: s.TLS.ClientKey, CAFlag: "-client-ca-keys"},
			[]string{"TLS handshake", "unknown authority", "the system roots", "no -client-ca-keys is given", "with -client-ca-keys"}},
		{"wrong CA file", Config{ClientCAKeys: s.TLS.UntrustedClientCert, ClientCert: s.TLS.ClientCert, ClientKey: s.TLS.ClientKey, CAFlag: "--cacert"},
			[]string{"TLS handshake", "unknown authority", "CA file " + s.TLS.UntrustedClientCert + ", given by --cacert", "with --cacert"}},
		{"wrong CA file, no flag named", Config{ClientCAKeys: s.TLS.UntrustedClientCert, ClientCert: s.TLS.ClientCert, ClientKey: s.TLS.ClientKey},
			[]string{"unknown authority", "CA file " + s.TLS.UntrustedClientCert, "the CA file setting"}},
		{"plain http to TLS server", Config{Nodes: []string{"http://" + hostPort}}, []string{"TLS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.cfg.Nodes == nil {
				tc.cfg.Nodes = []string{s.Endpoint}
			}
			expectRefused(t, tc.cfg, tc.want...)
		})
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	expectRefused(t, Config{Nodes: []string{etcdtest.UnusedEndpoint(t), etcdtest.UnusedEndpoint(t)}}, "unreachable", "connection refused")
}

// expectRefused asserts that New fails within about DialTimeout, naming the
// endpoints and the cause.
func expectRefused(t *testing.T, cfg Config, causes ...string) {
	t.Helper()
	// A quarter of DialTimeout (at most 1s) goes to the diagnosis, which
	// makes its own TLS handshake: 500ms left it 125ms, which a loaded CI
	// machine under -race missed ("TLS handshake failed: context deadline
	// exceeded" instead of the unknown authority).
	cfg.DialTimeout = 2 * time.Second
	start := time.Now()
	c, err := New(context.Background(), cfg)
	took := time.Since(start)
	if err == nil {
		_ = c.Close()
		t.Fatal("New succeeded")
	}
	// DialTimeout, plus up to a second to diagnose, plus slack for a busy machine.
	if limit := cfg.DialTimeout + 2*time.Second; took > limit {
		t.Errorf("New took %s, want under %s", took, limit)
	}
	for _, want := range append(causes, cfg.Nodes...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestNewRespectsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := New(ctx, Config{Nodes: []string{etcdtest.UnusedEndpoint(t)}, DialTimeout: 5 * time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestEndpointsFromSRV(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	s.Put(t, "/srv/k", "v")
	port := s.Endpoint[strings.LastIndex(s.Endpoint, ":")+1:]
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	r := srvRecords{"_etcd-client._tcp.cluster.test": {{Target: "127.0.0.1.", Port: uint16(p)}}}
	c, err := New(context.Background(), Config{SRVRecord: "_etcd-client._tcp.cluster.test", Resolver: r})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.cli.Endpoints(); len(got) != 1 || got[0] != s.Endpoint {
		t.Errorf("Endpoints = %q, want [%s]", got, s.Endpoint)
	}
	if got, _ := getValues(t, c, "/srv"); got["/srv/k"] != "v" {
		t.Errorf("GetValues = %v", got)
	}
}

func TestPlanReads(t *testing.T) {
	got := planReads([]string{"/foo", "/bar/", "/", "/foo", ""})
	want := []read{
		{from: "/foo"},
		{from: "/foo/", prefix: true},
		{from: "/bar/", prefix: true},
		{from: "/", prefix: true},
		{from: "", prefix: true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("planReads = %+v\nwant %+v", got, want)
	}
}

func TestDescribe(t *testing.T) {
	for keys, want := range map[string]string{
		"":               "no keys",
		"/a":             `keys ["/a"]`,
		"/a,/b,/c":       `keys ["/a" "/b" "/c"]`,
		"/a,/b,/c,/d,/e": `keys ["/a" "/b" "/c"] and 2 more`,
	} {
		var ks []string
		if keys != "" {
			ks = strings.Split(keys, ",")
		}
		if got := describe(ks); got != want {
			t.Errorf("describe(%q) = %s, want %s", ks, got, want)
		}
	}
}

// srvRecords answers SRV queries for full record names (SRVRecord), without DNS.
type srvRecords map[string][]*net.SRV

func (m srvRecords) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	return name, m[name], nil
}

// TestGetValuesPagesAtOneRevision reads ranges larger than a page: they
// come in several requests, never one response, and every page is read at
// the revision of the first even though all keys change after it.
func TestGetValuesPagesAtOneRevision(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	putAll := func(prefix string, n int, value string) {
		t.Helper()
		var ops []clientv3.Op
		for i := 0; i < n; i++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%03d", prefix, i), value))
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	putAll("/big/", 95, "old")
	putAll("/small/", 3, "old")
	putAll("/bigger/", 40, "old") // "/big" must not read these
	s.Put(t, "/big", "old")
	before := currentRev(t, cli)

	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	c.pageKeys = 10
	requests := 0
	c.afterBatch = func(attempt, batch int, _ int64) {
		requests++
		if batch == 0 {
			putAll("/big/", 95, "new")
			putAll("/small/", 3, "new")
		}
	}
	got, rev := getValues(t, c, "/big", "/small", "")
	if rev != before {
		t.Errorf("revision = %d, want %d", rev, before)
	}
	// One transaction of 5 reads (limit 2 each), then /big/ after its
	// first 2 keys (93 more: a page of 93/8 = 11, then 9 of 10), /small/
	// after its first 2 (1 page), and all 139 keys ("") after its first 2
	// (137 more: pages of 17, 15, 13, 11, 10, then 8 of 10).
	if requests != 25 {
		t.Errorf("%d requests, want 25 (one transaction and 24 pages)", requests)
	}
	if len(got) != 95+3+40+1 {
		t.Errorf("%d keys, want %d", len(got), 95+3+40+1)
	}
	for k, v := range got {
		if v != "old" {
			t.Fatalf("%s = %q: a page was not read at revision %d", k, v, rev)
		}
	}
	c.afterBatch = nil
	got, _ = getValues(t, c, "/big")
	if len(got) != 96 || got["/big/094"] != "new" || got["/bigger/000"] != "" {
		t.Errorf("second read: %d keys, /big/094 = %q", len(got), got["/big/094"])
	}

	// The same read as a list: one requested key's keys come in etcd's
	// order (by key) across the pages.
	pairs, _, err := c.GetPairs(context.Background(), []string{"/big"})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range pairs {
		keys = append(keys, kv.Key)
	}
	want := []string{"/big"}
	for i := 0; i < 95; i++ {
		want = append(want, fmt.Sprintf("/big/%03d", i))
	}
	if !slices.Equal(keys, want) {
		t.Errorf("GetPairs keys = %v, want %v", keys, want)
	}
}

// TestGetValuesPagesGrowWithTheRest: etcd counts the whole rest of a
// range for every page, so a read of n keys in pages of a fixed size makes
// it count n²/(2·page); pages of an eighth of what is left keep that linear
// in n (a million keys in pages of 10,000: 50 million counted, 9.6 s of
// etcd's CPU, against 8 million).
func TestGetValuesPagesGrowWithTheRest(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			s := etcdtest.Start(t, etcdtest.WithVersion(v))
			cli := s.Client(t)
			const n = 2560
			for i := 0; i < n; i += 128 {
				var ops []clientv3.Op
				for j := i; j < i+128; j++ {
					ops = append(ops, clientv3.OpPut(fmt.Sprintf("/g/%05d", j), "v"))
				}
				if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
					t.Fatal(err)
				}
			}
			c := connect(t, Config{Nodes: []string{s.Endpoint}})
			c.pageKeys = 10
			var counted int64
			requests := 0
			c.afterBatch = func(_, _ int, k int64) { counted += k; requests++ }
			if got, _ := getValues(t, c, "/g"); len(got) != n {
				t.Fatalf("read %d keys, want %d", len(got), n)
			}
			// The first transaction counts n, each page after it the rest
			// of the range: about 8·n in all. Pages of 10 would count
			// n²/20 = 327,680 keys in 256 requests.
			if counted > 10*n {
				t.Errorf("etcd counted %d keys in %d requests to read %d; want at most %d", counted, requests, n, 10*n)
			}
			t.Logf("%d keys read in %d requests; etcd counted %d", n, requests, counted)
		})
	}
}

// TestGetValuesPagesBoundBytes: pages after the first carry about
// pageBytes of keys and values, however few keys that is, and grow back to
// pageKeys when the values are short.
func TestGetValuesPagesBoundBytes(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	big := strings.Repeat("v", 1000)
	for prefix, value := range map[string]string{"/v/": big, "/w/": "s"} {
		var ops []clientv3.Op
		for i := 0; i < 100; i++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%03d", prefix, i), value))
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	c := connect(t, Config{Nodes: []string{s.Endpoint}})
	c.pageKeys, c.pageBytes = 40, 10_000
	requests := 0
	c.afterBatch = func(int, int, int64) { requests++ }
	got, _ := getValues(t, c, "/v")
	// A transaction of "/v" and "/v/" (20 keys each at most): 20 keys of
	// ~1 kB, then the other 80 in pages of 10,000 / 1,006 = 9 keys: 9 pages.
	if len(got) != 100 || got["/v/099"] != big {
		t.Fatalf("read %d keys, /v/099 = %.10q", len(got), got["/v/099"])
	}
	if requests != 10 {
		t.Errorf("%d requests, want 10 (one transaction and 9 pages of 9 keys)", requests)
	}
	requests = 0
	got, _ = getValues(t, c, "/w")
	// Short values: 20 keys, then pages of pageKeys (40): 2 pages.
	if len(got) != 100 || requests != 3 {
		t.Errorf("short values: read %d keys in %d requests, want 100 in 3", len(got), requests)
	}
}

// TestAppendRangeCopies: what a page leaves in the list is copied out of
// the response, so that no page's decoded messages (and the wire buffer
// they may share) outlive it beside everything read after: the peak of a
// large read is the list plus one page.
func TestAppendRangeCopies(t *testing.T) {
	r := &pb.RangeResponse{Count: 5, More: true, Kvs: []*mvccpb.KeyValue{
		{Key: []byte("/a"), Value: []byte("1")},
		{Key: []byte("/b"), Value: []byte("22")},
	}}
	pairs, rr := appendRange([]memkv.KVPair{{Key: "/0", Value: "0"}}, r)
	for _, kv := range r.Kvs {
		for _, b := range [][]byte{kv.Key, kv.Value} {
			for i := range b {
				b[i] = 'x'
			}
		}
	}
	want := []memkv.KVPair{{Key: "/0", Value: "0"}, {Key: "/a", Value: "1"}, {Key: "/b", Value: "22"}}
	if !slices.Equal(pairs, want) {
		t.Errorf("pairs after the response changed = %q, want %q", pairs, want)
	}
	if wantRR := (rangeReply{more: true, count: 5, kvs: 2, bytes: 7, last: "/b"}); rr != wantRR {
		t.Errorf("reply = %+v, want %+v", rr, wantRR)
	}
}

// A read that finds no etcd says why, not only "context deadline exceeded":
// the daemon logs this error on every retry while etcd is gone.
func TestGetValuesNamesTheCause(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t, etcdtest.WithTLS())
	c := connect(t, Config{Nodes: []string{s.Endpoint}, ClientCAKeys: s.TLS.CA, ClientCert: s.TLS.ClientCert, ClientKey: s.TLS.ClientKey, RequestTimeout: time.Second})
	getValues(t, c, "/k")
	s.Stop()
	_, _, err := c.GetValues(context.Background(), []string{"/k"})
	if err == nil {
		t.Fatal("GetValues with etcd stopped succeeded")
	}
	for _, want := range []string{s.Endpoint, "unreachable", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// A caller that gave up gets its own error, with no look for a cause.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := c.GetValues(ctx, []string{"/k"}); !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "cause:") {
		t.Errorf("GetValues with a canceled context: %v", err)
	}
}
