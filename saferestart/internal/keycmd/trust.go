package keycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

func (o *Trust) Run(ctx context.Context, a *cmdkit.Env) int {
	return a.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		tctx, cancel := a.OpCtx(ctx)
		defer cancel()
		rep, err := trust.Collect(tctx, cli, o.TrustPrefixes())
		if err != nil {
			a.Log.WithError(a.Etcd.Err(err)).Error("trust")
			return cmdkit.ExitError
		}
		// The hosts whose apiserver waits for a key to be trusted: the ones a
		// stale host keeps down.
		recs, err := rotation.List(tctx, cli, o.RotationPrefix)
		if err != nil {
			a.Log.WithError(a.Etcd.Err(err)).Error("trust: waiting records")
			return cmdkit.ExitError
		}
		waiting := []rotation.Waiting{}
		for _, h := range recs {
			if h.Waiting != nil {
				waiting = append(waiting, *h.Waiting)
			}
		}
		if o.Output == "json" {
			enc := json.NewEncoder(a.Stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(struct {
				*trust.Report
				Waiting   []rotation.Waiting     `json:"waiting"`
				Rotations []rotation.HostRecords `json:"rotations"`
			}{rep, waiting, recs})
		} else {
			err = rep.WriteText(a.Stdout)
			for _, w := range waiting {
				if err == nil {
					_, err = fmt.Fprintf(a.Stdout, "waiting: %s\n", w)
				}
			}
			for _, h := range recs {
				if err == nil && (h.State != nil || h.StateError != "" || h.Rotating) {
					_, err = fmt.Fprintf(a.Stdout, "rotation of %s: %s\n", h.Host, h.Text())
				}
			}
		}
		if err != nil {
			a.Log.WithError(err).Error("write trust report")
			return cmdkit.ExitError
		}
		if stale := rep.Stale(); len(stale) > 0 {
			a.Log.Warnf("stale hosts: %s (their apiservers do not trust every published key: tokens signed with it are refused there)", strings.Join(stale, ", "))
			return cmdkit.ExitStale
		}
		return cmdkit.ExitOK
	})
}

// Run is the `wait-trusted` subcommand. It runs before
// kube-apiserver starts (ExecStartPre, or sa-signing-key.service on
// kubeadm), often at boot, when etcd may not answer yet (a whole site
// powered up at once): it keeps trying etcd until --timeout rather than
// failing fast, which under systemd's Restart= would soon hit the unit's
// start limit and leave the apiserver down for good.
func (o *WaitTrusted) Run(ctx context.Context, a *cmdkit.Env) int {
	kids, err := trust.FileKeyIDs(o.PublicKey)
	if err != nil {
		a.Log.WithError(err).Error("wait-trusted: --public-key")
		return cmdkit.ExitPreflight
	}
	host := a.TrustHost(ctx)
	exclude := o.ExcludeHosts
	skipSigning := ""
	if o.IfNewKey {
		// The restart's own trust gate, for a start that no helper gated
		// (boot): a key this host already signed with was trusted when it
		// began to, and waiting for it here could wait on hosts that need
		// the restart lock a helper holds while systemd runs this.
		exclude = append(append([]string(nil), exclude...), host)
		skipSigning = host
	}
	var cli *clientv3.Client
	defer func() {
		if cli != nil {
			_ = cli.Close()
		}
	}()
	connect := func(ctx context.Context) (*clientv3.Client, error) {
		c, err := a.Dial(ctx)
		if err != nil {
			return nil, a.Etcd.Err(err)
		}
		cli = c
		return c, nil
	}
	log := a.Log.WithField("keys", strings.Join(kids, ","))
	rec := &waitingRecord{a: a, prefix: o.RotationPrefix, ttl: o.TTL, host: host, since: time.Now().UTC(), log: log}
	defer rec.withdraw()
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	rep, err := trust.Wait(wctx, nil, trust.WaitOptions{Prefixes: trust.Prefixes{Keys: o.KeysPrefix, Trust: o.TrustPrefix, Rotation: o.RotationPrefix}, Keys: kids, Exclude: exclude, SkipUnrecorded: o.SkipUnrecorded,
		SkipSigningOf: skipSigning, OpTimeout: a.Etcd.CommandTimeout, Client: connect, Announce: rec.announce, Log: log})
	var nt *trust.NotTrustedError
	switch {
	case err == nil:
		if own := rep.RecordOf(host); o.IfNewKey && own != nil && slices.Contains(kids, own.Signing) {
			log.WithField("host", host).Infof("key %s is the one this host signed with at its last recorded restart (%s): not waiting for it", own.Signing, own.Time.UTC().Format(time.RFC3339))
			if len(kids) == 1 { // FileKeyIDs names each key once
				o.recordStart(a, ctx, cli, own, log)
				fmt.Fprintf(a.Stdout, "no new key: %s signed with %s at its last recorded restart\n", host, own.Signing)
				return cmdkit.ExitOK
			}
		}
		if o.IfNewKey {
			o.recordStart(a, ctx, cli, rep.RecordOf(host), log)
		}
		if pubs := rep.Publishers(exclude); len(pubs) == 0 {
			log.Warnf("no host publishes keys under %s (other than those excluded): nothing to wait for", o.KeysPrefix)
		} else {
			log.Infof("trusted by every host: %s", strings.Join(pubs, ", "))
		}
		fmt.Fprintf(a.Stdout, "key %s trusted by every publishing host\n", strings.Join(kids, ", "))
		return cmdkit.ExitOK
	case cmdkit.Interrupted(ctx):
		log.Warn("wait-trusted interrupted")
		return cmdkit.ExitInterrupted
	case errors.As(err, &nt) && rep == nil:
		log.Errorf("etcd did not answer within --timeout %s (%v): could not read whether every host trusts key %s; check --endpoints and that etcd runs", o.Timeout, a.Etcd.Endpoints, strings.Join(kids, ", "))
		fmt.Fprintf(a.Stdout, "etcd did not answer: key %s not known to be trusted\n", strings.Join(kids, ", "))
		return cmdkit.ExitLockTimeout
	case errors.As(err, &nt):
		log.Errorf("key %s not trusted within --timeout %s by: %s", strings.Join(kids, ", "), o.Timeout, strings.Join(nt.Hosts, ", "))
		fmt.Fprintf(a.Stdout, "not trusted by: %s\n", strings.Join(nt.Hosts, " "))
		return cmdkit.ExitLockTimeout
	default:
		log.WithError(err).Error("wait-trusted")
		return cmdkit.ExitError
	}
}

// recordStart writes this host's trust record from the key files the
// apiserver about to start loads (wait-trusted --if-new-key runs just before
// it starts), when the record in etcd says otherwise. An apiserver started
// by systemd alone (boot, the start after an etcd restore) is otherwise
// recorded only at its next restart by the helper: after an etcd restore
// the records go back to the snapshot's, and a master whose key changed
// since then waits in its own wait-trusted for records that no restart
// would write, until --timeout. A restart by the helper writes the record
// again after its health gate. A failure is logged, not fatal: the
// apiserver may start either way.
func (o *WaitTrusted) recordStart(a *cmdkit.Env, ctx context.Context, cli *clientv3.Client, recorded *trust.Record, log logrus.FieldLogger) {
	// kubeadm's sa-signing-key.service runs wait-trusted before it links
	// the signing key the manifest names: nothing to record yet.
	if _, signing, err := restartcmd.ServiceAccountFiles(o.Preflight); err == nil && signing != "" {
		if _, err := os.Stat(signing); errors.Is(err, os.ErrNotExist) {
			log.Infof("no trust record written: the apiserver's signing key %s does not exist yet", signing)
			return
		}
	}
	// wait-trusted has no kube-controller-manager flags: the record's
	// key of it is the recorded one (below).
	snap := restartcmd.TrustSnapshot(ctx, a, o.Preflight, nil, log)
	if snap == nil || cli == nil {
		return
	}
	if recorded != nil {
		if recorded.Signing == snap.Signing && recorded.BundleSHA256 == snap.BundleSHA256 {
			return // a restart by the helper already recorded these files
		}
		// Starting the apiserver does not change kube-controller-manager's
		// key, which retire-keys reads from this record.
		if snap.ControllerManagerSigning == "" {
			snap.ControllerManagerSigning = recorded.ControllerManagerSigning
		}
	}
	pctx, cancel := a.OpCtx(ctx)
	defer cancel()
	if err := trust.Put(pctx, cli, o.TrustPrefix, "", *snap); err != nil {
		log.WithError(a.Etcd.Err(err)).Errorf("could not write the trust record %s of the apiserver about to start: other masters' trust waits see the record of its last restart", trust.Key(o.TrustPrefix, snap.Host))
		return
	}
	log.WithFields(logrus.Fields{"trust_key": trust.Key(o.TrustPrefix, snap.Host), "trusted": strings.Join(snap.Trusted, ","), "signing": snap.Signing}).
		Info("trust record written for the apiserver about to start (its recorded one named other key files)")
}

// waitingRecord keeps this host's waiting record (rotation.Waiting) for as
// long as wait-trusted waits: the fleet check of the restart that would
// trust this host's key reads it, and lets that restart go although this
// host's apiserver is not serving (it waits for exactly that restart).
type waitingRecord struct {
	a      *cmdkit.Env
	prefix string // --rotation-prefix
	ttl    int    // of the record's lease
	host   string
	since  time.Time
	log    logrus.FieldLogger
	ann    *rotation.Announcement
	keys   []string
}

// announce is trust.WaitOptions.Announce: it writes the record when there
// is none, its lease was lost, or the keys waited for changed.
func (w *waitingRecord) announce(ctx context.Context, cli *clientv3.Client, keys []string) (<-chan struct{}, error) {
	if w.ann != nil {
		select {
		case <-w.ann.Lost():
			w.log.Warnf("waiting record %s lost with its lease: writing it again", w.ann.Key())
			w.ann = nil
		default:
			if slices.Equal(keys, w.keys) {
				return w.ann.Lost(), nil
			}
			w.withdraw()
		}
	}
	actx, cancel := w.a.OpCtx(ctx)
	defer cancel()
	ann, err := rotation.Announce(actx, cli, w.prefix, w.ttl,
		rotation.Waiting{Host: w.host, Keys: keys, Since: w.since, PID: os.Getpid()})
	if err != nil {
		return nil, err
	}
	w.ann, w.keys = ann, keys
	w.log.Infof("waiting record %s written (bound to a %ds lease: it goes when this process does)", ann.Key(), w.ttl)
	return ann.Lost(), nil
}

func (w *waitingRecord) withdraw() {
	if w.ann == nil {
		return
	}
	if err := w.ann.Withdraw(); err != nil {
		w.log.WithError(err).Warn("waiting record not removed")
	} else {
		w.log.Debugf("waiting record %s removed", w.ann.Key())
	}
	w.ann = nil
}
