package restartcmd

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/fleet"
	"github.com/keysync/confd/saferestart/internal/restart"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// fleetInterval is the pause between reads of the Leases while the fleet
// check waits: apiservers renew every 10 s, so a shorter one finds nothing
// new.
const fleetInterval = 2 * time.Second

// fleetCheck is the look at the rest of the control plane (fleet package)
// for one restart: run before queueing (waiting up to --fleet-timeout) and
// once more under the lock (not waiting). Nil when --kubeconfig is not
// given.
type fleetCheck struct {
	*restarter
	client *clientv3.Client
	leases fleet.Leases
	cfg    fleet.Config
	log    logrus.FieldLogger
}

// newFleetCheck loads --kubeconfig; without it the check is skipped, said
// once. A kubeconfig that cannot be loaded is a setting to fix (exit 3).
func (r *restarter) newFleetCheck(host string, cli *clientv3.Client, log logrus.FieldLogger) (*fleetCheck, error) {
	o := r.o
	if o.Kubeconfig == "" {
		log.Info("fleet check skipped: no --kubeconfig to read the apiservers' identity Leases with")
		return nil, nil
	}
	leases, err := fleet.NewLeases(o.Kubeconfig, r.Etcd.CommandTimeout)
	if err != nil {
		return nil, err
	}
	return &fleetCheck{restarter: r, client: cli, leases: leases, log: log, cfg: fleet.Config{
		Host: host, LeaseAge: o.FleetLeaseAge, MinLive: o.MinLiveAPIServers, Timeout: o.FleetTimeout,
		Interval: fleetInterval, OpTimeout: r.Etcd.CommandTimeout, Log: log,
	}}, nil
}

// expected names the hosts whose apiserver must be live besides those the
// Leases show (fleet.Config.Expected), and those forget-host removed, whose
// Leases do not count (fleet.Config.Gone). The masters that publish keys
// and record trust run an apiserver: each must be live too, even once a
// graceful stop deleted its Lease. A master forget-host removed publishes
// no current key (not expected) and its lingering Lease is not a member's.
func (c *fleetCheck) expected(ctx context.Context, when string) (expected, gone []string) {
	rctx, cancel := c.OpCtx(ctx)
	defer cancel()
	rep, err := trust.Collect(rctx, c.client, c.o.TrustPrefixes())
	if err != nil {
		c.log.WithError(c.Etcd.Err(err)).Warnf("fleet check %s: cannot read which masters record trust: counting the identity Leases only", when)
		return nil, nil
	}
	return rep.Publishers(rep.Unrecorded()), rep.Gone()
}

// waiting names the hosts left out (fleet.Config.Waiting). A master whose
// apiserver waits (wait-trusted's waiting record) for keys this restart
// makes this apiserver trust is down until this restart: counting it would
// refuse the one restart that brings it back (a reimaged master's new key).
func (c *fleetCheck) waiting(ctx context.Context, when string) []string {
	rctx, cancel := c.OpCtx(ctx)
	defer cancel()
	recs, err := rotation.List(rctx, c.client, c.o.RotationPrefix)
	if err != nil {
		c.log.WithError(c.Etcd.Err(err)).Warnf("fleet check %s: cannot read the waiting records under --rotation-prefix: every master counts", when)
		return nil
	}
	var out, will []string
	for _, h := range recs {
		if h.Waiting == nil || h.Host == c.cfg.Host {
			continue
		}
		if will == nil { // what this restart makes this apiserver trust
			will = []string{}
			if snap := TrustSnapshot(ctx, c.Env, c.o.Preflight, c.o.CMFlagsFiles, c.log); snap != nil {
				will = snap.Trusted
			}
		}
		if len(h.Waiting.Keys) > 0 && !slices.ContainsFunc(h.Waiting.Keys, func(k string) bool { return !slices.Contains(will, k) }) {
			out = append(out, h.Host)
		} else {
			c.log.Infof("fleet check: %s: this restart does not make this apiserver trust every key it waits for, so it still counts", h.Waiting)
		}
	}
	return out
}

// run checks the fleet; wait says whether to wait for it. Exit 5 when too
// few other apiservers are live: nothing restarted, and no hold, since it
// is the fleet that is degraded, not this host.
func (c *fleetCheck) run(ctx context.Context, wait bool, when string) restart.Code {
	if c == nil {
		return restart.OK
	}
	if c.cfg.MinLive < 0 {
		lists := func(ctx context.Context) (expected, waiting []string) {
			expected, c.cfg.Gone = c.expected(ctx, when)
			return expected, c.waiting(ctx, when)
		}
		c.cfg.Expected, c.cfg.Waiting = lists(ctx)
		// Read again at each look while waiting: a reimaged master's
		// waiting record may come after its key started this restart.
		c.cfg.Refresh = lists
	}
	look := fleet.Check
	if wait {
		look = fleet.Wait
	}
	s, err := look(ctx, c.leases, c.cfg)
	var de *fleet.DegradedError
	switch {
	case err == nil && s.OK():
		c.log.Infof("fleet check %s: %s", when, s)
		return restart.OK
	case err == nil:
		c.log.Errorf("fleet check %s: %s: not restarting (this apiserver would be one more down); no hold written", when, s)
		return restart.LockTimeout
	case cmdkit.Interrupted(ctx):
		c.log.Warnf("fleet check %s interrupted", when)
		return restart.Interrupted
	case errors.As(err, &de):
		c.log.Errorf("fleet check %s: still %s after --fleet-timeout %s: not restarting; no hold written (the fleet is degraded, not this host)",
			when, de.Status, de.Timeout)
		return restart.LockTimeout
	case errors.Is(err, fleet.ErrAccess):
		c.log.WithError(err).Errorf("fleet check %s: the local apiserver refuses --kubeconfig's credentials (they need list on leases in kube-system): not restarting", when)
		return restart.Preflight
	default:
		c.log.WithError(err).Warnf("fleet check %s skipped: the local apiserver does not answer", when)
		return restart.OK
	}
}
