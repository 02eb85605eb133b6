package hold

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

func TestPutGetDelete(t *testing.T) {
	s := etcdtest.Start(t)
	cli := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := Get(ctx, cli, "h"); r != nil || err != nil {
		t.Fatalf("empty: %v %v", r, err)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := Add(ctx, cli, "h", Record{Host: "m1", PID: 7, Reason: "restart failed", Time: at, ExitCode: 6}); err != nil {
		t.Fatal(err)
	}
	r, err := Get(ctx, cli, "h")
	if err != nil || r == nil || r.Host != "m1" || r.Reason != "restart failed" || !r.Time.Equal(at) || r.Revision == 0 {
		t.Fatalf("get: %+v %v", r, err)
	}
	if s := r.String(); !strings.Contains(s, "m1") || !strings.Contains(s, "restart failed") || !strings.Contains(s, "2030-01-02T03:04:05Z") {
		t.Fatalf("string %q", s)
	}
	resp, _ := cli.Get(ctx, "h")
	if resp.Kvs[0].Lease != 0 {
		t.Fatal("hold must not carry a lease")
	}
	d, err := Delete(ctx, cli, "h")
	if err != nil || d == nil || d.Host != "m1" {
		t.Fatalf("delete: %+v %v", d, err)
	}
	if d, err := Delete(ctx, cli, "h"); d != nil || err != nil {
		t.Fatalf("second delete: %v %v", d, err)
	}
	// A hand-written value still holds.
	s.Put(t, "h", "stop, maintenance")
	r, err = Get(ctx, cli, "h")
	if err != nil || r == nil || r.Raw != "stop, maintenance" || !strings.Contains(r.String(), "maintenance") {
		t.Fatalf("raw: %+v %v", r, err)
	}
	// A hold is never overwritten: later reasons go beside the first,
	// whether it was written by hand or as a record.
	if _, err := Add(ctx, cli, "h", Record{Host: "m2", Reason: "lease lost"}); err != nil {
		t.Fatal(err)
	}
	r, _ = Get(ctx, cli, "h")
	if !strings.Contains(r.Reason, "stop, maintenance") || len(r.Also) != 1 || r.Also[0].Host != "m2" {
		t.Fatalf("hand-written hold overwritten: %+v", r)
	}
	_, _ = Delete(ctx, cli, "h")
	_, _ = Add(ctx, cli, "h", Record{Host: "op", User: "alice", Reason: "maintenance"})
	if _, err := Add(ctx, cli, "h", Record{Host: "m3", Reason: "restart failed"}); err != nil {
		t.Fatal(err)
	}
	r, _ = Get(ctx, cli, "h")
	if r.Host != "op" || r.Reason != "maintenance" || len(r.Also) != 1 || r.Also[0].Reason != "restart failed" ||
		!strings.Contains(r.String(), "maintenance") || !strings.Contains(r.String(), "restart failed") {
		t.Fatalf("operator's hold overwritten: %+v", r)
	}
}
