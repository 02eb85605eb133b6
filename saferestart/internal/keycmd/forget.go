package keycmd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/fleet"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// Args: forget-host takes the one HOST it removes.
func (o *ForgetHost) Args(_ *cmdkit.Shared, _ *cobra.Command, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return cli.Usagef("forget-host takes exactly one HOST (its name under --keys-prefix, as `trust` lists it), got %q", args)
	}
	if strings.Contains(args[0], "/") {
		return cli.Usagef("forget-host %q: a host name holds no /", args[0])
	}
	o.host = args[0]
	return nil
}

// forgetPlan is what forget-host does to one host, read before it does it.
type forgetPlan struct {
	host string
	// state is the host's keys and record as read.
	state keystate.State
	// next is state after Forget: every current key superseded.
	next keystate.State
	// present are the records that go (trust record, rotation state,
	// waiting record, restart intent): etcd key -> what it is.
	present map[string]string
}

// empty reports whether etcd holds nothing of the host: a mistyped name.
func (p *forgetPlan) empty() bool {
	return len(p.state.Items) == 0 && p.state.ValueErr == nil && len(p.state.Record.Superseded) == 0 &&
		len(p.state.Record.Retired) == 0 && p.state.Record.Forgotten.IsZero() && len(p.present) == 0
}

// steps lists, in order, what the plan changes.
func (p *forgetPlan) steps(o *ForgetHost) []string {
	var out []string
	for _, kid := range slices.Sorted(maps.Keys(p.next.Record.Superseded)) {
		s := p.next.Record.Superseded[kid]
		if _, already := p.state.Record.Superseded[kid]; already {
			out = append(out, fmt.Sprintf("key %s stays superseded (by %s), retired after %s", kid, s.By, s.RetireAfter.UTC().Format(time.RFC3339)))
			continue
		}
		out = append(out, fmt.Sprintf("supersede key %s: published until retire-keys retires it after %s (--grace %s)", kid, s.RetireAfter.UTC().Format(time.RFC3339), o.Grace))
	}
	store := cmdkit.KeyStore(nil, o.KeysPrefix, o.RotationPrefix)
	if p.state.Record.Forgotten.IsZero() {
		out = append(out, fmt.Sprintf("mark %s forgotten in its key record %s (kept until its keys are retired; its value goes with its last key)", p.host, store.RecordKey(p.host)))
	}
	for _, key := range slices.Sorted(maps.Keys(p.present)) {
		out = append(out, fmt.Sprintf("delete %s %s", p.present[key], key))
	}
	return out
}

// Run is the `forget-host HOST` subcommand: a master removed for
// good (or renamed: a new host plus forget-host of the old name) stops
// being one. Its keys become superseded now and stay published until
// retire-keys retires them after --grace, so the tokens it signed keep
// verifying meanwhile; its trust record, rotation state, waiting record
// and restart intent go, so that no trust wait, fleet check or signer
// barrier waits for it and no orphaned intent holds the line. It refuses
// while the host shows any sign of running.
func (o *ForgetHost) Run(ctx context.Context, a *cmdkit.Env) int {
	return a.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		host := o.host
		log := a.Log.WithField("forget", host)
		if self := a.TrustHost(ctx); host == self {
			log.Errorf("forget-host %s: that is this host (--host, or hostname -f): a master never forgets itself; shut it down and run forget-host %s on another master", host, host)
			return cmdkit.ExitPreflight
		}
		if code := o.forgetEvidence(ctx, a, cli, host, log); code != cmdkit.ExitOK {
			return code
		}
		p, err := o.readForgetPlan(ctx, a, cli, host, time.Now())
		if err != nil {
			log.WithError(a.Etcd.Err(err)).Error("forget-host: nothing done")
			return cmdkit.ExitError
		}
		if p.empty() {
			log.Errorf("forget-host %s: nothing under --keys-prefix %s, --trust-prefix %s or --rotation-prefix %s names that host: check the name (`trust` lists the hosts)",
				host, o.KeysPrefix, o.TrustPrefix, o.RotationPrefix)
			return cmdkit.ExitPreflight
		}
		if o.DryRun {
			fmt.Fprintf(a.Stdout, "dry run: nothing written or removed\n")
			for _, s := range p.steps(o) {
				fmt.Fprintf(a.Stdout, "would %s\n", s)
			}
			return cmdkit.ExitOK
		}
		// Claimed as rotate-key and retire-keys claim a host: a retire-keys
		// retiring its keys meanwhile would race the supersede.
		claim, err := rotation.Acquire(ctx, cli, o.RotationPrefix, host, fmt.Sprintf("%s pid %d forget-host", a.Host, os.Getpid()), cmdkit.ClaimTTL, 0)
		if errors.Is(err, rotation.ErrBusy) {
			log.WithError(err).Errorf("forget-host %s: a rotate-key or retire-keys of %s runs: nothing done; run forget-host again once it ends", host, host)
			return cmdkit.ExitLockTimeout
		}
		if err != nil {
			log.WithError(a.Etcd.Err(err)).Errorf("forget-host %s: cannot claim it under --rotation-prefix %s: nothing done", host, o.RotationPrefix)
			return cmdkit.ExitError
		}
		defer func() { _ = claim.Withdraw() }()
		// Read again under the claim: what is done is what is logged.
		if p, err = o.readForgetPlan(ctx, a, cli, host, time.Now()); err != nil {
			log.WithError(a.Etcd.Err(err)).Error("forget-host: nothing done")
			return cmdkit.ExitError
		}
		steps := p.steps(o)
		// The keys first: from then on the host publishes no current key and
		// no wait counts it, whatever else a kill leaves behind (a second run
		// finishes the rest).
		if err := cmdkit.UpdateKeys(ctx, a, cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix), host, func(cur keystate.State) (keystate.State, error) {
			return cur.Forget(byForgetHost, time.Now(), o.Grace), nil
		}); err != nil {
			log.WithError(err).Errorf("forget-host %s: its keys were not superseded: nothing done; run forget-host again", host)
			return cmdkit.ExitError
		}
		var ops []clientv3.Op
		intent := hold.IntentKey(o.HoldKeyOrDefault(), host)
		for key := range p.present {
			if key != intent {
				ops = append(ops, clientv3.OpDelete(key))
			}
		}
		dctx, cancel := a.OpCtx(ctx)
		defer cancel()
		if len(ops) > 0 {
			if _, err := cli.Txn(dctx).Then(ops...).Commit(); err != nil {
				log.WithError(a.Etcd.Err(err)).Errorf("forget-host %s: its keys are superseded, but its trust record and rotation records were not deleted: run forget-host again", host)
				return cmdkit.ExitError
			}
		}
		if _, ok := p.present[intent]; ok {
			if _, err := hold.DeleteIntent(dctx, cli, o.HoldKeyOrDefault(), host); err != nil {
				log.WithError(a.Etcd.Err(err)).Errorf("forget-host %s: its restart intent was not deleted (it may hold every restart): run forget-host again", host)
				return cmdkit.ExitError
			}
		}
		for _, s := range steps {
			log.Info(s)
		}
		fmt.Fprintf(a.Stdout, "%s forgotten: no trust wait, fleet check or signer barrier waits for it; its keys stay published until retire-keys retires them\n", host)
		return cmdkit.ExitOK
	})
}

func (o *ForgetHost) readForgetPlan(ctx context.Context, a *cmdkit.Env, cli *clientv3.Client, host string, now time.Time) (*forgetPlan, error) {
	rctx, cancel := a.OpCtx(ctx)
	defer cancel()
	st, err := cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix).Load(rctx, host)
	if err != nil {
		return nil, err
	}
	p := &forgetPlan{host: host, state: st, next: st.Forget(byForgetHost, now, o.Grace), present: map[string]string{}}
	what := map[string]string{
		trust.Key(o.TrustPrefix, host):                                    "trust record",
		(&rotation.EtcdStore{Prefix: o.RotationPrefix, Host: host}).Key(): "rotation state",
		rotation.WaitingKey(o.RotationPrefix, host):                       "waiting record",
		hold.IntentKey(o.HoldKeyOrDefault(), host):                        "restart intent",
	}
	keys := slices.Sorted(maps.Keys(what))
	var gets []clientv3.Op
	for _, k := range keys {
		gets = append(gets, clientv3.OpGet(k, clientv3.WithCountOnly()))
	}
	resp, err := cli.Txn(rctx).Then(gets...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", strings.Join(keys, ", "), err)
	}
	for i, k := range keys {
		if resp.Responses[i].GetResponseRange().Count > 0 {
			p.present[k] = what[k]
		}
	}
	return p, nil
}

// forgetEvidence refuses (exit 3) while the host shows signs of running:
// its publisher's lease-bound alive record, a restart intent whose lock
// lease is alive, or (--kubeconfig) its apiserver's fresh identity Lease. Forgetting a running master would make
// every rotation stop waiting for an apiserver that still serves tokens.
func (o *ForgetHost) forgetEvidence(ctx context.Context, a *cmdkit.Env, cli *clientv3.Client, host string, log logrus.FieldLogger) int {
	key := rotation.AliveKey(o.RotationPrefix, host)
	rctx, cancel := a.OpCtx(ctx)
	resp, err := cli.Get(rctx, key)
	cancel()
	if err != nil {
		log.WithError(a.Etcd.Err(err)).Errorf("forget-host %s: cannot read %s: nothing done", host, key)
		return cmdkit.ExitError
	}
	if len(resp.Kvs) > 0 {
		log.Errorf("forget-host %s: refused: %s exists (lease %x): the host's key publisher runs; stop it there (systemctl disable --now sa-key-publish), or wait for its lease to expire if the host is dead, then run forget-host again",
			host, key, resp.Kvs[0].Lease)
		return cmdkit.ExitPreflight
	}
	// A restart intent whose lock lease is alive is a restart of HOST
	// under way now; an orphaned one is what forget-host clears.
	rctx, cancel = a.OpCtx(ctx)
	intents, err := hold.Intents(rctx, cli, o.HoldKeyOrDefault())
	cancel()
	if err != nil {
		log.WithError(a.Etcd.Err(err)).Errorf("forget-host %s: cannot read the restart intents: nothing done", host)
		return cmdkit.ExitError
	}
	for _, in := range intents {
		if in.Host == host && !in.Orphaned {
			log.Errorf("forget-host %s: refused: its restart intent %s is live (lock lease %x): %s restarts its apiserver now; run forget-host again once it is shut down",
				host, in.Key, in.Lease, host)
			return cmdkit.ExitPreflight
		}
	}
	if o.Kubeconfig == "" {
		log.Infof("no --kubeconfig: %s's apiserver identity Lease not checked", host)
		return cmdkit.ExitOK
	}
	leases, err := fleet.NewLeases(o.Kubeconfig, a.Etcd.CommandTimeout)
	if err != nil {
		log.WithError(err).Errorf("forget-host %s: nothing done", host)
		return cmdkit.ExitPreflight
	}
	s, err := fleet.Check(ctx, leases, fleet.Config{Host: a.TrustHost(ctx), LeaseAge: cmdkit.DefaultFleetLeaseAge, MinLive: 0, OpTimeout: a.Etcd.CommandTimeout})
	switch {
	case errors.Is(err, fleet.ErrAccess):
		log.WithError(err).Errorf("forget-host %s: refused: the local apiserver refuses --kubeconfig's credentials (they need list on leases in kube-system)", host)
		return cmdkit.ExitPreflight
	case err != nil:
		log.WithError(err).Errorf("forget-host %s: cannot read the apiservers' identity Leases through --kubeconfig %s: nothing done; run it again once the local apiserver answers (or without --kubeconfig, having checked %s is down)", host, o.Kubeconfig, host)
		return cmdkit.ExitError
	}
	if live := s.LiveAs(host); live != "" {
		log.Errorf("forget-host %s: refused: the identity Lease of apiserver %s (in %s) was renewed within %s: it is serving; shut it down, then run forget-host again",
			host, live, fleet.Namespace, cmdkit.DefaultFleetLeaseAge)
		return cmdkit.ExitPreflight
	}
	log.Infof("%s's apiserver has no live identity Lease (%s)", host, s)
	return cmdkit.ExitOK
}
