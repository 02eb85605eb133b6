// Package fleet looks at the rest of the control plane before this host's
// kube-apiserver goes down: it counts the apiservers that are serving from
// their identity Leases (kube-system, label
// apiserver.kubernetes.io/identity=kube-apiserver), read from the local
// apiserver. Every kube-apiserver renews its own Lease every 10 s (v1.37.2);
// its leaseDurationSeconds is 3600, so only renewTime says whether it is
// alive.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The identity Leases, as kube-apiserver writes them.
const (
	Namespace     = "kube-system"
	IdentityLabel = "apiserver.kubernetes.io/identity"
	IdentityValue = "kube-apiserver"
	HostnameLabel = "kubernetes.io/hostname"
)

const Selector = IdentityLabel + "=" + IdentityValue

// SeenWithin is how recently an apiserver must have renewed its Lease to
// count, by default, as a member of the fleet that must be live: one that
// has been gone longer was taken out of service, not lost.
const SeenWithin = time.Hour

// AllOthers as MinLive means every other apiserver seen within SeenWithin.
const AllOthers = -1

type Config struct {
	// Host is this host's name (--host); its Lease is the one whose
	// hostname label equals Host or Host's first label.
	Host string
	// LeaseAge: a Lease renewed longer ago than this is not live.
	LeaseAge time.Duration
	// MinLive is how many other apiservers must be live; AllOthers (or any
	// negative number): every other apiserver seen within SeenWithin, and
	// every host in Expected.
	MinLive int
	// Expected are hosts whose apiserver must be live whatever their Lease
	// says: an apiserver stopped gracefully deletes its identity Lease on
	// exit (v1.37.2: "Cleaning up lease on exit"), so the Leases alone
	// lose it. A Lease matches an expected host when its hostname label
	// equals the name or the name's first label.
	Expected []string
	// Waiting are hosts whose apiserver is not serving because it waits
	// (wait-trusted) for this host's restart to trust its key: neither
	// their Lease nor Expected counts them, for refusing that restart
	// would keep both down for good (a reimaged kubeadm master). Matched
	// as Expected is.
	Waiting []string
	// Gone are hosts forget-host removed: their Leases (an apiserver shut
	// down for good renews nothing, but its Lease lingers for up to
	// SeenWithin) are not counted. Matched as Expected is.
	Gone []string
	// Refresh, when set, gives Expected and Waiting afresh before each of
	// Wait's reads after the first: a master may start waiting while this
	// check waits (a reimaged master publishes its new key, which starts
	// this restart, before its wait-trusted writes the waiting record), and
	// counting it until Timeout would refuse the restart it waits for.
	Refresh func(ctx context.Context) (expected, waiting []string)
	// Timeout bounds Wait.
	Timeout time.Duration
	// Interval is the pause between reads while Wait waits.
	Interval time.Duration
	// OpTimeout bounds one read.
	OpTimeout time.Duration
	Log       logrus.FieldLogger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Status is what one read of the Leases says.
type Status struct {
	// Self are the hostname labels taken as this host.
	Self []string
	// Live are the other hosts whose Lease is fresh.
	Live []string
	// Missing are the other hosts seen within SeenWithin whose Lease is
	// not fresh, with its age ("m3 (renewed 45s ago)").
	Missing []string
	// Want is how many other hosts must be live.
	Want int
	// Waiting are the hosts left out as Config.Waiting says.
	Waiting []string
}

// LiveAs returns the name among s.Live that is host (equal, or one is the
// other's first label), "" when host's apiserver is not live.
func (s Status) LiveAs(host string) string { return matching(s.Live, host) }

func (s Status) OK() bool { return len(s.Live) >= s.Want }

func (s Status) String() string {
	msg := fmt.Sprintf("%d of %d other apiservers live", len(s.Live), s.Want)
	if len(s.Live) > 0 {
		msg += " (" + strings.Join(s.Live, ", ") + ")"
	}
	if len(s.Missing) > 0 {
		msg += "; not live: " + strings.Join(s.Missing, ", ")
	}
	if len(s.Waiting) > 0 {
		msg += "; not counted, waiting for this restart to trust their key: " + strings.Join(s.Waiting, ", ")
	}
	return msg
}

// ErrUnavailable wraps a read the local apiserver did not answer (down,
// refusing connections, not ready): the check is skipped then, since a
// broken local apiserver is often why it is being restarted.
var ErrUnavailable = errors.New("local apiserver does not answer")

// ErrAccess wraps a refusal of the kubeconfig's credentials (401, 403): a
// setting that no restart fixes.
var ErrAccess = errors.New("local apiserver refuses the kubeconfig's credentials")

// DegradedError is a fleet that stayed short of live apiservers.
type DegradedError struct {
	Status  Status
	Timeout time.Duration
}

func (e *DegradedError) Error() string {
	return fmt.Sprintf("fleet degraded after waiting %s: %s", e.Timeout, e.Status)
}

// Leases is what the check reads: the List of client-go's Lease client for
// kube-system.
type Leases func(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)

// NewLeases reads kube-system's Leases from the apiserver a kubeconfig file
// names, with each request bounded by opTimeout.
//
// A REST client with a scheme of coordination/v1 alone, rather than
// client-go's typed clientset: that one registers every API group
// (k8s.io/client-go/kubernetes/scheme) and made the helper's binary 35 MB
// larger; this costs a fraction (measured in the commit that added it).
func NewLeases(kubeconfig string, opTimeout time.Duration) (Leases, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.Timeout = opTimeout
	cfg.UserAgent = "kube-apiserver-safe-restart"
	scheme := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cfg.GroupVersion = &coordinationv1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	params := runtime.NewParameterCodec(scheme)
	// As client-go's typed client lists them.
	return func(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
		list := &coordinationv1.LeaseList{}
		return list, rc.Get().Namespace(Namespace).Resource("leases").VersionedParams(&opts, params).Do(ctx).Into(list)
	}, nil
}

// Check reads the Leases once.
func Check(ctx context.Context, leases Leases, cfg Config) (Status, error) {
	if cfg.OpTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.OpTimeout)
		defer cancel()
	}
	list, err := leases(ctx, metav1.ListOptions{LabelSelector: Selector})
	if err != nil {
		if apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) {
			return Status{}, fmt.Errorf("%w: list leases in %s: %w", ErrAccess, Namespace, err)
		}
		return Status{}, fmt.Errorf("%w: list leases in %s: %w", ErrUnavailable, Namespace, err)
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	return status(list.Items, cfg, now()), nil
}

// status counts hosts: a host's newest Lease decides.
func status(items []coordinationv1.Lease, cfg Config, now time.Time) Status {
	short, _, _ := strings.Cut(cfg.Host, ".")
	newest := map[string]time.Time{}
	self := map[string]bool{}
	var s Status
	waiting := map[string]bool{}
	for _, l := range items {
		host := l.Labels[HostnameLabel]
		if host == "" {
			host = l.Name
		}
		if host == cfg.Host || host == short {
			self[host] = true
			continue
		}
		if w := matching(cfg.Waiting, host); w != "" {
			waiting[w] = true
			continue
		}
		if matching(cfg.Gone, host) != "" {
			continue
		}
		var t time.Time
		switch {
		case l.Spec.RenewTime != nil:
			t = l.Spec.RenewTime.Time
		case l.Spec.AcquireTime != nil:
			t = l.Spec.AcquireTime.Time
		}
		if old, ok := newest[host]; !ok || t.After(old) {
			newest[host] = t
		}
	}
	expected := map[string]bool{}
	for _, e := range cfg.Expected {
		if e == cfg.Host || e == "" {
			continue
		}
		if w := matching(cfg.Waiting, e); w != "" {
			waiting[w] = true
			continue
		}
		first, _, _ := strings.Cut(e, ".")
		match := ""
		for host := range newest {
			if host == e || host == first {
				match = host
			}
		}
		if match == "" {
			s.Missing = append(s.Missing, e+" (no identity Lease)")
			continue
		}
		expected[match] = true
	}
	for host, t := range newest {
		age := now.Sub(t)
		switch {
		case age <= cfg.LeaseAge:
			s.Live = append(s.Live, host)
		case age <= SeenWithin || expected[host]:
			s.Missing = append(s.Missing, fmt.Sprintf("%s (renewed %s ago)", host, age.Round(time.Second)))
		}
	}
	s.Self, s.Waiting = slices.Sorted(maps.Keys(self)), slices.Sorted(maps.Keys(waiting))
	slices.Sort(s.Live)
	slices.Sort(s.Missing)
	s.Want = len(s.Live) + len(s.Missing) // every other host seen
	if cfg.MinLive >= 0 {
		s.Want = cfg.MinLive
	}
	return s
}

// matching returns the name among names that host (a Lease's hostname
// label, or a full name) is: equal, or one of them is the other's first
// label. "" when none is.
func matching(names []string, host string) string {
	hostFirst, _, _ := strings.Cut(host, ".")
	for _, n := range names {
		first, _, _ := strings.Cut(n, ".")
		if n != "" && (n == host || first == host || n == hostFirst) {
			return n
		}
	}
	return ""
}

// Wait reads the Leases until enough other apiservers are live, for up to
// cfg.Timeout. It returns a *DegradedError when they stay short, and an
// error wrapping ErrUnavailable or ErrAccess when a read fails.
func Wait(ctx context.Context, leases Leases, cfg Config) (Status, error) {
	s, err := Check(ctx, leases, cfg)
	if err != nil || s.OK() {
		return s, err
	}
	cfg.Log.Warnf("fleet check: %s: waiting up to --fleet-timeout %s, holding no lock, for them to serve again", s, cfg.Timeout)
	deadline := time.NewTimer(cfg.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(cmp.Or(cfg.Interval, 2*time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-deadline.C:
			return s, &DegradedError{Status: s, Timeout: cfg.Timeout}
		case <-tick.C:
		}
		if cfg.Refresh != nil {
			cfg.Expected, cfg.Waiting = cfg.Refresh(ctx)
		}
		next, err := Check(ctx, leases, cfg)
		if err != nil {
			return s, err
		}
		if next.OK() {
			cfg.Log.Infof("fleet check: %s: the fleet serves again", next)
			return next, nil
		}
		s = next
	}
}
