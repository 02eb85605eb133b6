package keycmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// keyRotation is rotate-key and retire-keys on one etcd client: the
// rotation's restart (Restart) runs on it too, rather than through a
// second connection.
type keyRotation struct {
	*cmdkit.Env
	o *RotateKey
}

func (o *RotateKey) Run(ctx context.Context, e *cmdkit.Env) int {
	return e.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		return (&keyRotation{Env: e, o: o}).rotateKey(ctx, cli)
	})
}

// step is the rotation's install step, on rotate-key's one client.
func (k *keyRotation) step(cli *clientv3.Client, host string, log logrus.FieldLogger) *restartcmd.Step {
	return &restartcmd.Step{Env: k.Env, Opts: &k.o.Restarting, Signer: k.o.Signer, Client: cli, Name: host, Logger: log}
}

func (k *keyRotation) rotator(cli *clientv3.Client, host string, log logrus.FieldLogger) *rotation.Rotator {
	o := k.o
	store := cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix)
	return &rotation.Rotator{
		Host:      host,
		Files:     rotation.Files{SigningKey: o.SigningKey, PublicKey: o.PublicKey},
		Algorithm: o.Algorithm,
		Grace:     o.Grace,
		Store:     &rotation.EtcdStore{KV: cli, Prefix: o.RotationPrefix, Host: host},
		Log:       log,
		Publish: func(ctx context.Context, value []byte) error {
			items, err := keystate.ParseValue(o.PublicKey, value, false)
			if err != nil {
				return err
			}
			return cmdkit.UpdateKeys(ctx, k.Env, store, host, func(cur keystate.State) (keystate.State, error) {
				next, _, err := cur.Publish(items, byRotateKey, time.Now(), o.Grace)
				return next, err
			})
		},
		Keys: &rotationKeys{a: k.Env, store: store, host: host},
		WaitTrusted: func(ctx context.Context, kid string) error {
			wctx, cancel := context.WithTimeout(ctx, o.Timeout)
			defer cancel()
			_, err := trust.Wait(wctx, cli, trust.WaitOptions{Prefixes: o.TrustPrefixes(), Keys: []string{kid}, OpTimeout: k.Etcd.CommandTimeout, Log: log})
			var nt *trust.NotTrustedError
			if errors.As(err, &nt) && !cmdkit.Interrupted(ctx) {
				return &cmdkit.CodeError{Code: cmdkit.ExitLockTimeout, What: fmt.Sprintf("next key %s not trusted within --timeout %s by %s; nothing installed", kid, o.Timeout, strings.Join(nt.Hosts, ", "))}
			}
			return err
		},
		Restart: k.step(cli, host, log).Restart,
	}
}

func (k *keyRotation) rotateKey(ctx context.Context, cli *clientv3.Client) int {
	o := k.o
	host := k.TrustHost(ctx)
	// The restart run by the install step records trust under this name too.
	k.HostFlag = host
	log := k.Log.WithFields(logrus.Fields{"host": host, "rotation": rotation.DefaultPrefix})
	r := k.rotator(cli, host, log)
	// Missing or wrong key files are not worth retrying: exit 3 before
	// anything is claimed, generated or published.
	if err := r.Files.Check(); err != nil {
		log.WithError(err).Error("rotate-key: the key files do not allow a rotation: nothing done")
		return cmdkit.ExitPreflight
	}
	if o.DryRun {
		lines, err := r.Plan(ctx)
		if err != nil {
			log.WithError(k.Etcd.Err(err)).Error("rotate-key --dry-run")
			return cmdkit.ExitError
		}
		fmt.Fprintln(k.Stdout, "dry run: nothing written, published or restarted")
		for _, l := range lines {
			fmt.Fprintln(k.Stdout, l)
		}
		fmt.Fprintf(k.Stdout, "the wait-trusted step waits up to --timeout %s, before the restart below (whose worst case follows)\n", o.Timeout)
		// The restart the install step would run.
		return k.step(cli, host, log).Run(ctx)
	}
	// A hold stops every restart: publishing the next key now would only
	// queue restarts the hold refuses, and the wait would time out. An
	// abort restarts nothing.
	if !o.IgnoreHold && !o.Abort {
		hctx, cancel := k.OpCtx(ctx)
		// Another host's orphaned restart intent counts, as for restart.
		rec, _, err := hold.Active(hctx, cli, o.HoldKeyOrDefault(), host)
		cancel()
		if err != nil {
			log.WithError(k.Etcd.Err(err)).Error("rotate-key: cannot read the hold")
			return cmdkit.ExitError
		}
		if rec != nil {
			log.Errorf("hold active: %s; not rotating. Fix the cause and `%s unhold` first", rec, cmdkit.ProgName)
			return cmdkit.ExitHold
		}
	}
	claim, err := rotation.Acquire(ctx, cli, o.RotationPrefix, host, fmt.Sprintf("%s pid %d", k.Host, os.Getpid()), o.TTL, time.Duration(o.TTL+2)*time.Second)
	if err != nil {
		if errors.Is(err, rotation.ErrBusy) {
			log.WithError(err).Error("another rotate-key is running for this host: not starting a second one")
			return cmdkit.ExitLockTimeout
		}
		log.WithError(k.Etcd.Err(err)).Error("rotate-key: cannot claim the rotation")
		return cmdkit.ExitError
	}
	defer func() { _ = claim.Withdraw() }()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-claim.Lost():
			log.Error("rotation claim lost (etcd lease expired): stopping; re-run rotate-key to continue")
			cancel()
		case <-rctx.Done():
		}
	}()
	switch {
	case o.Abort:
		err = r.Abort(rctx)
	case o.Rollback:
		err = r.Rollback(rctx)
	default:
		err = r.Run(rctx)
	}
	var ce *cmdkit.CodeError
	switch {
	case err == nil:
		return cmdkit.ExitOK
	case errors.Is(err, rotation.ErrState):
		log.WithError(err).Error("rotate-key refused: nothing changed")
		return cmdkit.ExitPreflight
	case errors.As(err, &ce):
		log.Errorf("%v; re-run rotate-key to continue from this step", err)
		return ce.Code
	case cmdkit.Interrupted(ctx):
		log.WithError(err).Warn("rotate-key interrupted; re-run it to continue from this step")
		return cmdkit.ExitInterrupted
	default:
		log.WithError(err).Error("rotate-key failed; re-run it to continue from this step")
		return cmdkit.ExitError
	}
}

// rotationKeys is the rotation's side of the host's key record
// (rotation.KeySet).
type rotationKeys struct {
	a     *cmdkit.Env
	store *keystate.Store
	host  string
}

// Withdraw retires kid at once: rotate-key --abort's next key, which
// nothing ever signed with.
func (r *rotationKeys) Withdraw(ctx context.Context, kid string) error {
	return cmdkit.UpdateKeys(ctx, r.a, r.store, r.host, func(cur keystate.State) (keystate.State, error) {
		return cur.Retire([]string{kid}, time.Now())
	})
}

// Supersede keeps kid published as superseded until retireAfter (the first
// time recorded stands) and makes resumed a current key again.
func (r *rotationKeys) Supersede(ctx context.Context, kid string, retireAfter time.Time, resumed string) error {
	by := byRotateKey
	if resumed != "" {
		by += " --rollback"
	}
	return cmdkit.UpdateKeys(ctx, r.a, r.store, r.host, func(cur keystate.State) (keystate.State, error) {
		return cur.Supersede(kid, retireAfter, by, resumed, time.Now())
	})
}

// Retired reports whether kid is tombstoned in the host's key record.
func (r *rotationKeys) Retired(ctx context.Context, kid string) (bool, error) {
	lctx, cancel := r.a.OpCtx(ctx)
	defer cancel()
	st, err := r.store.Load(lctx, r.host)
	if err != nil {
		return false, r.a.Etcd.Err(err)
	}
	_, ok := st.Record.Retired[kid]
	return ok, nil
}
