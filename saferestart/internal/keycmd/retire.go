package keycmd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// Run is the `retire-keys` subcommand: every due superseded key of
// every host with a record under --rotation-prefix is retired, whichever
// master runs it (a reimaged host has no local state for its old key; a
// removed host runs nothing). Each host is claimed as rotate-key claims it,
// so that runs on several masters at once retire each key once: a host
// another run holds is skipped. A due key is kept (exit 0, logged) while
// any apiserver's stale-token counter says a client may still hold a token
// it signed (staleTokenGate). Then this host's own files lose the keys
// retired so far.
func (o *RetireKeys) Run(ctx context.Context, e *cmdkit.Env) int {
	return e.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		return (&retirer{Env: e, o: o, cli: cli}).retireKeys(ctx)
	})
}

// retirer is retire-keys on one etcd client.
type retirer struct {
	*cmdkit.Env
	o   *RetireKeys
	cli *clientv3.Client
	// The stale-token records, read once per run (a record that does not
	// parse is logged, its host unknown), and the hosts with an apiserver
	// (a trust record), those without a record being unknown.
	stale map[string]staletokens.Record
	hosts []string
}

func (k *retirer) retireKeys(ctx context.Context) int {
	o := k.o
	cli := k.cli
	self := k.TrustHost(ctx)
	log := k.Log.WithField("host", self)
	store := cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix)
	lctx, cancel := k.OpCtx(ctx)
	hosts, err := store.Hosts(lctx)
	var recs map[string]trust.Record
	if err == nil {
		recs, _, err = trust.List(lctx, cli, o.TrustPrefix)
	}
	var problems []string
	if err == nil {
		k.stale, problems, err = staletokens.List(lctx, cli, o.RotationPrefix)
	}
	cancel()
	if err != nil {
		log.WithError(k.Etcd.Err(err)).Error("retire-keys: cannot read the key records, trust records and stale-token records: nothing retired")
		return cmdkit.ExitError
	}
	for _, p := range problems {
		log.Warn(p)
	}
	k.hosts = slices.Sorted(maps.Keys(recs))
	if o.DryRun {
		fmt.Fprintln(k.Stdout, "dry run: nothing retired, written or removed")
	}
	code, retired := cmdkit.ExitOK, 0
	for _, h := range hosts {
		c, n := k.retireHost(ctx, store, h, recs)
		retired += n
		if c != cmdkit.ExitOK && (code == cmdkit.ExitOK || code == cmdkit.ExitPreflight) {
			code = c
		}
	}
	if retired == 0 && code == cmdkit.ExitOK && !o.DryRun {
		log.Info("no superseded key is due on any host: nothing to retire")
	}
	if o.DryRun {
		return code
	}
	// The keys retired (by this run or any other) leave this host's
	// --public-key and --signing-key's backup.
	lctx, cancel = k.OpCtx(ctx)
	cur, err := store.Load(lctx, self)
	cancel()
	if err != nil {
		log.WithError(k.Etcd.Err(err)).Warn("retire-keys: cannot read this host's key record: its key files are not trimmed")
		return code
	}
	// retire-keys has no --certificate: the public key file is trimmed.
	cmdkit.TrimOwnFiles(cur.Record, o.SigningKey, o.PublicKey, "", log)
	return code
}

// retireHost retires host's due superseded keys, and reports the exit code
// and how many keys it retired.
func (k *retirer) retireHost(ctx context.Context, store *keystate.Store, host string, recs map[string]trust.Record) (int, int) {
	o := k.o
	cli := k.cli
	log := k.Log.WithField("host", host)
	if !o.DryRun {
		claim, err := rotation.Acquire(ctx, cli, o.RotationPrefix, host, fmt.Sprintf("%s pid %d retire-keys", k.Host, os.Getpid()), cmdkit.ClaimTTL, 0)
		if errors.Is(err, rotation.ErrBusy) {
			log.WithError(err).Infof("%s is being rotated or retired by another run: skipped, its run retires its keys", host)
			return cmdkit.ExitOK, 0
		}
		if err != nil {
			log.WithError(k.Etcd.Err(err)).Errorf("retire-keys: cannot claim %s: skipped", host)
			return cmdkit.ExitError, 0
		}
		defer func() { _ = claim.Withdraw() }()
	}
	rs := &rotation.EtcdStore{KV: cli, Prefix: o.RotationPrefix, Host: host}
	lctx, cancel := k.OpCtx(ctx)
	st, err := rs.Load(lctx)
	cancel()
	if err != nil {
		log.WithError(k.Etcd.Err(err)).Errorf("retire-keys: %s skipped", host)
		return cmdkit.ExitError, 0
	}
	// Upgrade in place: a rotation installed by an older helper recorded
	// its previous key's retire time in its state only.
	legacy := st != nil && st.Phase == rotation.PhaseInstalled && st.Previous != ""
	if legacy && !o.DryRun {
		if err := cmdkit.UpdateKeys(ctx, k.Env, store, host, func(cur keystate.State) (keystate.State, error) {
			return cur.Supersede(st.Previous, st.RetireAfter, byRotateKey, "", time.Now())
		}); err != nil {
			log.WithError(err).Errorf("retire-keys: cannot record %s's previous key %s as superseded: skipped", host, st.Previous)
			return cmdkit.ExitError, 0
		}
	}
	lctx, cancel = k.OpCtx(ctx)
	cur, err := store.Load(lctx, host)
	cancel()
	if err != nil {
		log.WithError(k.Etcd.Err(err)).Errorf("retire-keys: %s skipped", host)
		return cmdkit.ExitError, 0
	}
	if legacy && o.DryRun {
		if cur, err = cur.Supersede(st.Previous, st.RetireAfter, byRotateKey, "", time.Now()); err != nil {
			log.WithError(err).Errorf("retire-keys: %s skipped", host)
			return cmdkit.ExitError, 0
		}
	}
	now := time.Now()
	own := k.ownSigning(host)
	code := cmdkit.ExitOK
	var due []string
	for _, kid := range slices.Sorted(maps.Keys(cur.Record.Superseded)) {
		s := cur.Record.Superseded[kid]
		klog := log.WithField("superseded", kid)
		switch {
		case now.Before(s.RetireAfter):
			k.plan(klog, "%s: key %s (superseded by %s) stays published until %s", host, kid, s.By, s.RetireAfter.UTC().Format(time.RFC3339))
		case slices.Contains(own, kid):
			klog.Warnf("%s: key %s is due, but %s still signs with it: kept", host, kid, o.SigningKey)
		default:
			ok, c := k.retireGates(ctx, kid, recs, klog)
			if c != cmdkit.ExitOK {
				code = c
			}
			if !ok || !k.staleTokenGate(kid, s.Since, klog) {
				continue
			}
			k.plan(klog, "%s: would retire key %s (superseded by %s, due since %s)", host, kid, s.By, s.RetireAfter.UTC().Format(time.RFC3339))
			due = append(due, kid)
		}
	}
	if o.DryRun {
		return code, 0
	}
	if len(due) == 0 {
		return k.markRotationRetired(ctx, rs, st, cur.Record, log, code), 0
	}
	uctx, cancel := k.OpCtx(ctx)
	res, err := store.Update(uctx, host, func(cur keystate.State) (keystate.State, error) {
		// Only what is still superseded: a key made current again
		// meanwhile (a rollback) is not retired.
		var still []string
		for _, kid := range due {
			if _, ok := cur.Record.Superseded[kid]; ok {
				still = append(still, kid)
			}
		}
		return cur.Retire(still, time.Now())
	})
	cancel()
	if err != nil {
		log.WithError(k.Etcd.Err(err)).Errorf("retire-keys: %s: nothing retired", host)
		return cmdkit.ExitError, 0
	}
	n := 0
	for _, kid := range due {
		if _, ok := res.Record.Retired[kid]; ok {
			n++
			log.WithField("retired", kid).Infof("%s: key %s retired: no longer published; a bundle-mode apiserver drops it at its next restart, a signer-mode one within its signer's refresh hint", host, kid)
		}
	}
	if !res.Record.Forgotten.IsZero() && len(res.Items) == 0 {
		log.Infof("%s: gone (forget-host %s) and every key of it retired: its published value is deleted; trust no longer lists it",
			host, res.Record.Forgotten.UTC().Format(time.RFC3339))
	}
	return k.markRotationRetired(ctx, rs, st, res.Record, log, code), n
}

// markRotationRetired records a host's installed rotation as retired once
// its previous key is: rotate-key --rollback then refuses, and a new
// rotate-key starts afresh.
func (k *retirer) markRotationRetired(ctx context.Context, rs *rotation.EtcdStore, st *rotation.State, rec keystate.Record, log logrus.FieldLogger, code int) int {
	if st == nil || st.Phase != rotation.PhaseInstalled || rec.Retired[st.Previous].IsZero() {
		return code
	}
	st.Phase, st.Updated = rotation.PhaseRetired, time.Now().UTC()
	sctx, cancel := k.OpCtx(ctx)
	err := rs.Save(sctx, *st)
	cancel()
	if err != nil {
		log.WithError(k.Etcd.Err(err)).Errorf("retire-keys: %s's rotation state not marked retired (its previous key %s is): run retire-keys again", st.Host, st.Previous)
		return cmdkit.ExitError
	}
	return code
}

// plan logs a line, and prints it under --dry-run.
func (k *retirer) plan(log logrus.FieldLogger, format string, args ...any) {
	if k.o.DryRun {
		fmt.Fprintf(k.Stdout, format+"\n", args...)
		return
	}
	log.Infof(format, args...)
}

// ownSigning is the key ID in --signing-key when host is this host: a key
// this apiserver signs with is never retired, whatever its trust record
// says yet.
func (k *retirer) ownSigning(host string) []string {
	if host != k.TrustHost(context.Background()) || k.o.SigningKey == "" {
		return nil
	}
	ids, _ := trust.FileKeyIDs(k.o.SigningKey) // nil when unreadable
	return ids
}
