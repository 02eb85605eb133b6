package fleet

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sirupsen/logrus"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// lease is an identity Lease as kube-apiserver v1.37.2 writes it: renewed
// `age` ago, leaseDurationSeconds 3600.
func lease(name, host string, age time.Duration) *coordinationv1.Lease {
	renew := metav1.NewMicroTime(now.Add(-age))
	dur := int32(3600)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{IdentityLabel: IdentityValue, HostnameLabel: host}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &dur, RenewTime: &renew},
	}
}

func cfg(host string, min int) Config {
	return Config{Host: host, LeaseAge: 30 * time.Second, MinLive: min, Timeout: time.Minute, Interval: time.Millisecond, Now: func() time.Time { return now }, Log: quiet}
}

// A gracefully stopped apiserver deletes its Lease: the hosts the caller
// expects (those recording trust) are missing then, not forgotten.
func TestCheckExpected(t *testing.T) {
	leases := fake.NewClientset(lease("a1", "m1", time.Second), lease("a2", "m2", time.Second), lease("a4", "m4", 3*time.Hour)).CoordinationV1().Leases(Namespace).List
	c := cfg("m1.example.com", AllOthers)
	c.Expected = []string{"m1.example.com", "m2.example.com", "m3.example.com", "m4.example.com"}
	s, err := Check(context.Background(), leases, c)
	if err != nil {
		t.Fatal(err)
	}
	if s.OK() || s.Want != 3 || strings.Join(s.Live, ",") != "m2" || strings.Join(s.Missing, ",") != "m3.example.com (no identity Lease),m4 (renewed 3h0m0s ago)" {
		t.Errorf("got %s (want %d)", s, s.Want)
	}
	c.MinLive = 1
	if s, _ := Check(context.Background(), leases, c); !s.OK() {
		t.Errorf("an explicit minimum: %s", s)
	}
}

func TestCheck(t *testing.T) {
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: Namespace}}
	tests := []struct {
		name     string
		host     string
		min      int
		leases   []*coordinationv1.Lease
		ok       bool
		live     string
		missing  string
		self     string
		wantHost int
	}{
		{"all live", "m1.example.com", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m1", 5*time.Second), lease("a2", "m2", 9*time.Second), lease("a3", "m3", 30*time.Second)},
			true, "m2,m3", "", "m1", 2},
		{"one stopped: its renewTime is old though its duration (3600 s) has not run out", "m1.example.com", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m1", 5*time.Second), lease("a2", "m2", 9*time.Second), lease("a3", "m3", 45*time.Second)},
			false, "m2", "m3 (renewed 45s ago)", "m1", 2},
		{"gone for more than an hour: out of service, not counted", "m1.example.com", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m1", 5*time.Second), lease("a2", "m2", 9*time.Second), lease("a3", "m3", 2*time.Hour)},
			true, "m2", "", "m1", 1},
		{"this host by its full name; its own stale Lease does not count", "m1.example.com", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m1.example.com", 10*time.Minute), lease("a2", "m2.example.com", time.Second)},
			true, "m2.example.com", "", "m1.example.com", 1},
		{"a host named like this one's first label in another domain is this host", "m1.example.com", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m1", time.Second), lease("a2", "m2", time.Second)},
			true, "m2", "", "m1", 1},
		{"a prefix is not this host", "m1", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m10", 45*time.Second), lease("a2", "m1", time.Second)},
			false, "", "m10 (renewed 45s ago)", "m1", 1},
		{"explicit minimum met by one of two", "m1", 1,
			[]*coordinationv1.Lease{lease("a2", "m2", time.Second), lease("a3", "m3", time.Minute)},
			true, "m2", "m3 (renewed 1m0s ago)", "", 1},
		{"explicit minimum above the fleet", "m1", 3,
			[]*coordinationv1.Lease{lease("a2", "m2", time.Second), lease("a3", "m3", time.Second)},
			false, "m2,m3", "", "", 3},
		{"a single master has nobody to wait for", "m1", AllOthers,
			[]*coordinationv1.Lease{lease("a1", "m1", time.Second)},
			true, "", "", "m1", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := []runtime.Object{other}
			for _, l := range tt.leases {
				objs = append(objs, l)
			}
			leases := fake.NewClientset(objs...).CoordinationV1().Leases(Namespace).List
			s, err := Check(context.Background(), leases, cfg(tt.host, tt.min))
			if err != nil {
				t.Fatal(err)
			}
			if s.OK() != tt.ok || strings.Join(s.Live, ",") != tt.live || strings.Join(s.Missing, ",") != tt.missing ||
				strings.Join(s.Self, ",") != tt.self || s.Want != tt.wantHost {
				t.Errorf("got ok=%v live=%q missing=%q self=%q want=%d; want ok=%v live=%q missing=%q self=%q want=%d",
					s.OK(), s.Live, s.Missing, s.Self, s.Want, tt.ok, tt.live, tt.missing, tt.self, tt.wantHost)
			}
		})
	}
}

// The label selector reaches the server: a Lease without the identity
// label (the controller-manager's leader Lease) is never counted.
func TestCheckSelectsIdentityLeases(t *testing.T) {
	c := fake.NewClientset()
	var sel atomic.Value
	c.PrependReactor("list", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel.Store(a.(k8stesting.ListAction).GetListRestrictions().Labels.String())
		return false, nil, nil
	})
	if _, err := Check(context.Background(), c.CoordinationV1().Leases(Namespace).List, cfg("m1", AllOthers)); err != nil {
		t.Fatal(err)
	}
	if got := sel.Load(); got != Selector {
		t.Errorf("label selector %q, want %q", got, Selector)
	}
}

func TestCheckErrors(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	for _, tt := range []struct {
		err  error
		want error
	}{
		{apierrors.NewForbidden(gr, "", errors.New("RBAC")), ErrAccess},
		{apierrors.NewUnauthorized("no"), ErrAccess},
		{errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), ErrUnavailable},
		{apierrors.NewServiceUnavailable("not ready"), ErrUnavailable},
	} {
		c := fake.NewClientset()
		c.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tt.err })
		_, err := Check(context.Background(), c.CoordinationV1().Leases(Namespace).List, cfg("m1", AllOthers))
		if !errors.Is(err, tt.want) {
			t.Errorf("%v: got %v, want %v", tt.err, err, tt.want)
		}
	}
}

// Wait returns as soon as the missing apiserver renews its Lease.
func TestWaitUntilLive(t *testing.T) {
	c := fake.NewClientset(lease("a2", "m2", time.Second), lease("a3", "m3", 45*time.Second))
	var lists atomic.Int32
	c.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) == 3 { // m3 comes back before the third read
			if err := c.Tracker().Update(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}, lease("a3", "m3", time.Second), Namespace); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	s, err := Wait(context.Background(), c.CoordinationV1().Leases(Namespace).List, cfg("m1", AllOthers))
	if err != nil || !s.OK() || strings.Join(s.Live, ",") != "m2,m3" {
		t.Fatalf("Wait = %v, %v", s, err)
	}
	if n := lists.Load(); n != 3 {
		t.Errorf("%d reads, want 3", n)
	}
}

// A fleet that stays short ends the wait with the missing hosts named.
func TestWaitDegraded(t *testing.T) {
	c := fake.NewClientset(lease("a2", "m2", time.Second), lease("a3", "m3", 45*time.Second))
	conf := cfg("m1", AllOthers)
	conf.Timeout = 20 * time.Millisecond
	_, err := Wait(context.Background(), c.CoordinationV1().Leases(Namespace).List, conf)
	var de *DegradedError
	if !errors.As(err, &de) {
		t.Fatalf("Wait = %v, want a DegradedError", err)
	}
	if !strings.Contains(err.Error(), "m3 (renewed 45s ago)") || strings.Contains(strings.Join(de.Status.Missing, ","), "m2") {
		t.Errorf("error %q should name m3 only", err)
	}
}

// A local apiserver that stops answering during the wait ends it with
// ErrUnavailable (the caller skips the check).
func TestWaitUnavailable(t *testing.T) {
	c := fake.NewClientset(lease("a3", "m3", 45*time.Second))
	var lists atomic.Int32
	c.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) > 1 {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	if _, err := Wait(context.Background(), c.CoordinationV1().Leases(Namespace).List, cfg("m1", AllOthers)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Wait = %v, want ErrUnavailable", err)
	}
}

// The kubeadm reimage deadlock: m2 came back with a new key and its
// apiserver waits (wait-trusted) for m1's restart to trust that key, so m2
// has no live Lease and still records trust. Counting it would refuse
// m1's restart for good; a host that waits is left out (and said so),
// whether its old Lease is still there or not.
func TestCheckWaitingHostDoesNotRefuse(t *testing.T) {
	for name, items := range map[string][]*coordinationv1.Lease{
		"old Lease":  {lease("a1", "m1", time.Second), lease("a2", "m2", 20*time.Minute), lease("a3", "m3", time.Second)},
		"Lease gone": {lease("a1", "m1", time.Second), lease("a3", "m3", time.Second)},
	} {
		var objs []runtime.Object
		for _, l := range items {
			objs = append(objs, l)
		}
		leases := fake.NewClientset(objs...).CoordinationV1().Leases(Namespace).List
		c := cfg("m1.example.com", AllOthers)
		c.Expected = []string{"m1.example.com", "m2.example.com", "m3.example.com"}
		s, err := Check(context.Background(), leases, c)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK() {
			t.Fatalf("%s: without the waiting record m2 must be missing: %s", name, s)
		}
		c.Waiting = []string{"m2.example.com"}
		s, err = Check(context.Background(), leases, c)
		if err != nil {
			t.Fatal(err)
		}
		if !s.OK() || s.Want != 1 || strings.Join(s.Live, ",") != "m3" || len(s.Missing) != 0 || strings.Join(s.Waiting, ",") != "m2.example.com" ||
			!strings.Contains(s.String(), "waiting for this restart to trust their key: m2.example.com") {
			t.Errorf("%s: m2 waits for this restart: got %s (want %d)", name, s, s.Want)
		}
	}
}

// A master forget-host removed left its Lease behind (up to SeenWithin):
// it is no member that must be live, and LiveAs names a live host only.
func TestCheckGoneHostNotCounted(t *testing.T) {
	leases := fake.NewClientset(lease("a2", "m2", time.Second), lease("a3", "m3", 5*time.Minute)).CoordinationV1().Leases(Namespace).List
	c := cfg("m1.example.com", AllOthers)
	s, err := Check(context.Background(), leases, c)
	if err != nil || s.OK() {
		t.Fatalf("before: %s %v, want m3 missing", s, err)
	}
	c.Gone = []string{"m3.example.com"}
	s, err = Check(context.Background(), leases, c)
	if err != nil || !s.OK() || s.Want != 1 || len(s.Missing) != 0 {
		t.Fatalf("m3 gone: %s %v", s, err)
	}
	if s.LiveAs("m2.example.com") != "m2" || s.LiveAs("m3.example.com") != "" {
		t.Fatalf("LiveAs: %q %q", s.LiveAs("m2.example.com"), s.LiveAs("m3.example.com"))
	}
}

// A master that starts waiting while the check waits is left out at the
// next read: a reimaged master publishes its new key (which starts this
// restart) before its wait-trusted writes the waiting record, and waiting
// for its Lease until Timeout would refuse the restart it waits for.
func TestWaitRefreshesWaiting(t *testing.T) {
	cs := fake.NewClientset(lease("a1", "m1", time.Second), lease("a3", "m3", time.Second))
	// Without the refresh the wait would last the hour: end it after a
	// few reads, so that the test fails instead of hanging.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var lists atomic.Int32
	cs.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) > 5 {
			cancel()
		}
		return false, nil, nil
	})
	leases := cs.CoordinationV1().Leases(Namespace).List
	c := cfg("m1.example.com", AllOthers)
	c.Timeout = time.Hour
	c.Expected = []string{"m1.example.com", "m2.example.com", "m3.example.com"}
	var refreshes atomic.Int32
	c.Refresh = func(context.Context) ([]string, []string) {
		if refreshes.Add(1) < 2 {
			return c.Expected, nil
		}
		return c.Expected, []string{"m2.example.com"} // wait-trusted started on m2
	}
	s, err := Wait(ctx, leases, c)
	if err != nil || !s.OK() || strings.Join(s.Waiting, ",") != "m2.example.com" {
		t.Fatalf("Wait = %s, %v; want OK with m2 left out as waiting", s, err)
	}
	if n := refreshes.Load(); n != 2 {
		t.Errorf("%d refreshes, want 2", n)
	}
}

// quiet is the logger of tests that do not read the log.
var quiet = func() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}()
