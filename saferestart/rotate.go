package saferestart

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

const (
	DefaultSigningKey = "/etc/kubernetes/pki/sa.key"
	DefaultPublicKey  = "/etc/kubernetes/pki/sa.pub"
)

// ValidatePrefixes: the prefixes given must not be empty, and the keys'
// and the trust records' must differ (p: flag name -> value, in order).
func ValidatePrefixes(keysPrefix, trustPrefix, rotationPrefix *string) []error {
	var errs []error
	for _, p := range []struct {
		name string
		v    *string
	}{{"--keys-prefix", keysPrefix}, {"--trust-prefix", trustPrefix}, {"--rotation-prefix", rotationPrefix}} {
		if p.v != nil && strings.TrimSuffix(*p.v, "/") == "" {
			errs = append(errs, Usagef("%s %q: must not be empty", p.name, *p.v))
		}
	}
	if keysPrefix != nil && trustPrefix != nil && etcdkey.Dir(*keysPrefix) == etcdkey.Dir(*trustPrefix) {
		errs = append(errs, Usagef("--keys-prefix and --trust-prefix must differ (%q)", *keysPrefix))
	}
	return errs
}

func (p *Prefixes) Validate() []error {
	return ValidatePrefixes(&p.KeysPrefix, &p.TrustPrefix, &p.RotationPrefix)
}

func (p *Prefixes) TrustPrefixes() trust.Prefixes {
	// The rotation prefix holds the key records: which published keys are
	// superseded and which hosts forget-host removed (not waited for).
	return trust.Prefixes{Keys: p.KeysPrefix, Trust: p.TrustPrefix, Rotation: p.RotationPrefix}
}

func (h *Host) Validate() []error {
	if h.HostName != "" {
		if err := etcdkey.ValidHost(h.HostName); err != nil {
			return []error{Usagef("--host: %v", err)}
		}
	}
	return nil
}

// hostFlag is --host, for the invocation's host names.
func (h *Host) HostFlag() string { return h.HostName }

// KeyFileDefaults: rotate-key and retire-keys read sa.key and sa.pub unless
// told otherwise.
func KeyFileDefaults(signingKey, publicKey *string) {
	if *signingKey == "" {
		*signingKey = DefaultSigningKey
	}
	if *publicKey == "" {
		*publicKey = DefaultPublicKey
	}
}

func ValidateGrace(grace time.Duration) []error {
	if grace < 0 {
		return []error{Usagef("--grace %s: must not be negative", grace)}
	}
	return nil
}

func ValidateTimeout(timeout time.Duration) []error {
	if timeout <= 0 {
		return []error{Usagef("--timeout %s: must be positive", timeout)}
	}
	return nil
}

// codeError carries a subcommand's exit code through the rotation package.
type codeError struct {
	code int
	what string
}

func (e *codeError) Error() string { return fmt.Sprintf("%s (exit %d)", e.what, e.code) }

// keyRotation is rotate-key and retire-keys on one etcd client: the
// rotation's restart (Restart) runs on it too, rather than through a
// second connection.
type keyRotation struct {
	*Env
	o    *rotateKeyCmd
	cli  *clientv3.Client
	host string
	log  logrus.FieldLogger
}

func (o *rotateKeyCmd) Run(ctx context.Context, e *Env) int {
	return e.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		return (&keyRotation{Env: e, o: o, cli: cli}).rotateKey(ctx, cli)
	})
}

// Restart is the rotation's restart step (rotation.Restarter): this
// apiserver through the lock, or, with --signer, the signer's switch to
// the next key; then kube-controller-manager when it holds the key.
func (k *keyRotation) Restart(ctx context.Context) error {
	if k.o.Signer {
		// The signer's barrier switched the apiserver's tokens to the new
		// key; kube-controller-manager has no external signer and still
		// signs legacy tokens from its key file: restarted as in bundle
		// mode, after every apiserver trusts the key.
		if err := k.signerSwitch(ctx, k.cli, k.host); err != nil {
			return err
		}
		return k.restartControllerManager(ctx, k.log)
	}
	if code := k.restarter().restart(ctx); code != ExitOK {
		return &codeError{code: code, what: "restart through the lock failed"}
	}
	return k.restartControllerManager(ctx, k.log)
}

// restarter is the restart rotate-key runs, on its client (text output:
// rotate-key has no --output).
func (k *keyRotation) restarter() *restarter {
	return &restarter{Env: k.Env, o: &k.o.Restarting, output: "text", cli: k.cli}
}

func (k *keyRotation) rotator(cli *clientv3.Client, host string, log logrus.FieldLogger) *rotation.Rotator {
	a := k.Env
	o := k.o
	store := KeyStore(cli, o.KeysPrefix, o.RotationPrefix)
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
			return UpdateKeys(ctx, a, store, host, func(cur keystate.State) (keystate.State, error) {
				next, _, err := cur.Publish(items, cmdRotateKey, time.Now(), o.Grace)
				return next, err
			})
		},
		Keys: &rotationKeys{a: a, store: store, host: host},
		WaitTrusted: func(ctx context.Context, kid string) error {
			wctx, cancel := context.WithTimeout(ctx, o.Timeout)
			defer cancel()
			_, err := trust.Wait(wctx, cli, trust.WaitOptions{Prefixes: o.TrustPrefixes(), Keys: []string{kid}, OpTimeout: a.Etcd.CommandTimeout, Log: log})
			var nt *trust.NotTrustedError
			if errors.As(err, &nt) && !Interrupted(ctx) {
				return &codeError{code: ExitLockTimeout, what: fmt.Sprintf("next key %s not trusted within --timeout %s by %s; nothing installed", kid, o.Timeout, strings.Join(nt.Hosts, ", "))}
			}
			return err
		},
		Restarter: k,
	}
}

// rotateKey is the `rotate-key` subcommand.
func (k *keyRotation) rotateKey(ctx context.Context, cli *clientv3.Client) int {
	a := k.Env
	o := k.o
	host := a.TrustHost(ctx)
	// The restart run by the install step records trust under this name too.
	a.HostFlag = host
	log := a.Log.WithFields(logrus.Fields{"host": host, "rotation": rotation.DefaultPrefix})
	k.cli, k.host, k.log = cli, host, log
	r := k.rotator(cli, host, log)
	// Missing or wrong key files are not worth retrying: exit 3 before
	// anything is claimed, generated or published.
	if err := r.Files.Check(); err != nil {
		log.WithError(err).Error("rotate-key: the key files do not allow a rotation: nothing done")
		return ExitPreflight
	}
	if o.DryRun {
		lines, err := r.Plan(ctx)
		if err != nil {
			log.WithError(a.EtcdErr(err)).Error("rotate-key --dry-run")
			return ExitError
		}
		fmt.Fprintln(a.Stdout, "dry run: nothing written, published or restarted")
		for _, l := range lines {
			fmt.Fprintln(a.Stdout, l)
		}
		fmt.Fprintf(a.Stdout, "the wait-trusted step waits up to --timeout %s, before the restart below (whose worst case follows)\n", o.Timeout)
		// The restart the install step would run.
		return k.restarter().restart(ctx)
	}
	// A hold stops every restart: publishing the next key now would only
	// queue restarts the hold refuses, and the wait would time out. An
	// abort restarts nothing.
	if !o.IgnoreHold && !o.Abort {
		hctx, cancel := a.OpCtx(ctx)
		// Another host's orphaned restart intent counts, as for restart.
		rec, err := hold.Active(hctx, cli, o.HoldKeyOrDefault(), host)
		cancel()
		if err != nil {
			log.WithError(a.EtcdErr(err)).Error("rotate-key: cannot read the hold")
			return ExitError
		}
		if rec != nil {
			log.Errorf("hold active: %s; not rotating. Fix the cause and `%s unhold` first", rec, ProgName)
			return ExitHold
		}
	}
	claim, err := rotation.Acquire(ctx, cli, o.RotationPrefix, host, fmt.Sprintf("%s pid %d", a.Host, os.Getpid()), o.TTL, time.Duration(o.TTL+2)*time.Second)
	if err != nil {
		if errors.Is(err, rotation.ErrBusy) {
			log.WithError(err).Error("another rotate-key is running for this host: not starting a second one")
			return ExitLockTimeout
		}
		log.WithError(a.EtcdErr(err)).Error("rotate-key: cannot claim the rotation")
		return ExitError
	}
	defer func() { _ = claim.Release() }()
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
	var ce *codeError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, rotation.ErrState):
		log.WithError(err).Error("rotate-key refused: nothing changed")
		return ExitPreflight
	case errors.As(err, &ce):
		log.Errorf("%v; re-run rotate-key to continue from this step", err)
		return ce.code
	case Interrupted(ctx):
		log.WithError(err).Warn("rotate-key interrupted; re-run it to continue from this step")
		return ExitInterrupted
	default:
		log.WithError(err).Error("rotate-key failed; re-run it to continue from this step")
		return ExitError
	}
}

// UpdateKeys applies change to host's published key set (one
// compare-and-swap, retried on conflict).
func UpdateKeys(ctx context.Context, a *Env, store *keystate.Store, host string, change func(keystate.State) (keystate.State, error)) error {
	uctx, cancel := a.OpCtx(ctx)
	defer cancel()
	if _, err := store.Update(uctx, host, change); err != nil {
		return a.EtcdErr(err)
	}
	return nil
}

// rotationKeys is the rotation's side of the host's key record
// (rotation.KeySet).
type rotationKeys struct {
	a     *Env
	store *keystate.Store
	host  string
}

// Withdraw retires kid at once: rotate-key --abort's next key, which
// nothing ever signed with.
func (r *rotationKeys) Withdraw(ctx context.Context, kid string) error {
	return UpdateKeys(ctx, r.a, r.store, r.host, func(cur keystate.State) (keystate.State, error) {
		return cur.Retire([]string{kid}, time.Now())
	})
}

// Supersede keeps kid published as superseded until retireAfter (the first
// time recorded stands) and makes resumed a current key again.
func (r *rotationKeys) Supersede(ctx context.Context, kid string, retireAfter time.Time, resumed string) error {
	by := cmdRotateKey
	if resumed != "" {
		by += " --rollback"
	}
	return UpdateKeys(ctx, r.a, r.store, r.host, func(cur keystate.State) (keystate.State, error) {
		return cur.Supersede(kid, retireAfter, by, resumed, time.Now())
	})
}

// Retired reports whether kid is tombstoned in the host's key record.
func (r *rotationKeys) Retired(ctx context.Context, kid string) (bool, error) {
	a := r.a
	lctx, cancel := a.OpCtx(ctx)
	defer cancel()
	st, err := r.store.Load(lctx, r.host)
	if err != nil {
		return false, a.EtcdErr(err)
	}
	_, ok := st.Record.Retired[kid]
	return ok, nil
}
