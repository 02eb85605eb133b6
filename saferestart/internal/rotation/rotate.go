// Package rotation rotates one host's service-account signing key so that
// no token is refused: the next key is published beside the current one,
// installed as the signing key only once every host trusts it, and the
// previous public key is withdrawn only after a grace period. Each step is
// recorded in a Store, so a re-run after a crash continues where it stopped,
// and every step is idempotent.
package rotation

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/internal/keystate"
)

// Rotator runs one host's rotation. The etcd, trust and restart sides are
// functions so the step machine is tested without them.
type Rotator struct {
	Host      string
	Files     Files
	Algorithm string
	Grace     time.Duration
	Store     Store
	// Publish makes value (PEM public keys) this host's current keys in
	// its published value.
	Publish func(ctx context.Context, value []byte) error
	// Keys is the host's key record (superseded and retired keys).
	Keys KeySet
	// WaitTrusted returns once every publishing host trusts kid.
	WaitTrusted func(ctx context.Context, kid string) error
	// Restart restarts this host's apiserver through the lock (preflight,
	// trust record and health gate included), or switches its signer, to
	// sign with the key now in Files.SigningKey; then it makes the other
	// holders of the signing key (the controller-manager) follow.
	Restart func(ctx context.Context) error
	Log     logrus.FieldLogger
}

// KeySet is the host's published key set beyond its current keys: the
// keys it superseded, published until retire-keys (any master's) retires
// them after their grace, and the retired ones, never published again.
type KeySet interface {
	// Withdraw retires kid at once (abort's next key: nothing signed with it).
	Withdraw(ctx context.Context, kid string) error
	// Supersede keeps kid published until retireAfter (a time already
	// recorded for kid stands) and makes resumed ("" none) current again.
	Supersede(ctx context.Context, kid string, retireAfter time.Time, resumed string) error
	// Retired reports whether kid was retired.
	Retired(ctx context.Context, kid string) (bool, error)
}

// stepErr is a rotation step that failed, named in the message.
func stepErr(step string, err error) error {
	return fmt.Errorf("rotate-key step %q: %w", step, err)
}

// Steps, in order, as logged and shown by Plan.
const (
	StepGenerate = "generate"
	StepPublish  = "publish"
	StepWait     = "wait-trusted"
	StepInstall  = "install"
	StepRestart  = "restart"
	StepRecord   = "record-grace"
)

// Run carries the rotation from its stored state to PhaseInstalled. A
// rotation already installed is left as it is (its previous key is
// retire-keys' business); after PhaseRetired, or with no state, a new
// rotation starts.
func (r *Rotator) Run(ctx context.Context) error {
	st, err := r.Store.Load(ctx)
	if err != nil {
		return stepErr("load state", err)
	}
	if st != nil && st.Phase == PhaseInstalled {
		// A rotation installed by an older helper has no record of its
		// previous key: recorded now, with the rotation's retire time.
		if err := r.supersede(ctx, st.Previous, st.RetireAfter, ""); err != nil {
			return stepErr(StepRecord, err)
		}
		r.Log.WithFields(logrus.Fields{"next": st.Next, "previous": st.Previous}).
			Infof("rotation already done: key %s signs since %s; previous key %s is retired by retire-keys after %s",
				st.Next, st.Installed.Format(time.RFC3339), st.Previous, st.RetireAfter.Format(time.RFC3339))
		r.removeTemporaries()
		return nil
	}
	if st != nil && st.Phase == PhaseRollingBack {
		return stateErr("a rollback is under way: re-run rotate-key --rollback")
	}
	if st == nil || st.Phase == PhaseRetired || st.Phase == "" {
		cur, err := signingKeyID(r.Files.SigningKey)
		if err != nil {
			return stepErr(StepGenerate, fmt.Errorf("current signing key: %w", err))
		}
		st = &State{Host: r.Host, Algorithm: r.Algorithm, Previous: cur, Grace: r.Grace.String(), Started: time.Now().UTC()}
		r.Log.WithField("previous", cur).Info("starting a rotation of this host's service-account key")
	} else {
		r.Log.WithFields(logrus.Fields{"phase": st.Phase, "next": st.Next}).Info("resuming the rotation")
	}
	save := func(p Phase) error {
		st.Phase, st.Updated = p, time.Now().UTC()
		return r.Store.Save(ctx, *st)
	}

	if st.Phase == "" || st.Phase == PhaseGenerated {
		// Until the next key is published it may be made again: a missing
		// or changed file is regenerated rather than trusted.
		if st.Phase == "" || !r.nextFilesMatch(st.Next) {
			kid, err := r.generate()
			if err != nil {
				return stepErr(StepGenerate, err)
			}
			st.Next = kid
			if err := save(PhaseGenerated); err != nil {
				return stepErr(StepGenerate, err)
			}
		}
		r.Log.WithFields(logrus.Fields{"step": StepGenerate, "next": st.Next, "file": r.Files.NextKey()}).Info("next key pair ready (mode 0600)")
	}

	if st.Phase == PhaseGenerated || st.Phase == PhasePublished {
		// Re-published on a re-run too: cheap, and it repairs a lost put.
		if err := r.publish(ctx, st.Next); err != nil {
			return stepErr(StepPublish, err)
		}
		if err := save(PhasePublished); err != nil {
			return stepErr(StepPublish, err)
		}
		r.Log.WithFields(logrus.Fields{"step": StepPublish, "previous": st.Previous, "next": st.Next}).Info("published the current and the next public key")

		r.Log.WithFields(logrus.Fields{"step": StepWait, "next": st.Next}).Info("waiting until every host's apiserver trusts the next key")
		if err := r.WaitTrusted(ctx, st.Next); err != nil {
			return stepErr(StepWait, err)
		}
		if err := save(PhaseInstalling); err != nil {
			return stepErr(StepWait, err)
		}
		r.Log.WithFields(logrus.Fields{"step": StepWait, "next": st.Next}).Info("every host trusts the next key")
	}

	if st.Phase == PhaseInstalling {
		if err := r.install(st); err != nil {
			return stepErr(StepInstall, err)
		}
		r.Log.WithFields(logrus.Fields{"step": StepRestart}).Info("restarting this apiserver through the lock to sign with the next key")
		if err := r.Restart(ctx); err != nil {
			return stepErr(StepRestart, err)
		}
		st.Installed = time.Now().UTC()
		st.RetireAfter = st.Installed.Add(r.Grace)
		st.Grace = r.Grace.String()
		// The previous key stays published as superseded until
		// RetireAfter, whoever writes the value meanwhile; a re-run after a
		// crash here keeps the first retire time.
		if err := r.supersede(ctx, st.Previous, st.RetireAfter, ""); err != nil {
			return stepErr(StepRecord, err)
		}
		if err := save(PhaseInstalled); err != nil {
			return stepErr(StepRecord, err)
		}
		r.removeTemporaries()
		r.Log.WithFields(logrus.Fields{"step": StepRecord, "next": st.Next, "previous": st.Previous, "retire_after": st.RetireAfter.Format(time.RFC3339)}).
			Infof("rotation done: key %s signs; previous key %s stays trusted until %s (retire-keys)", st.Next, st.Previous, st.RetireAfter.Format(time.RFC3339))
		return nil
	}
	return fmt.Errorf("rotation state has unknown phase %q", st.Phase)
}

func (r *Rotator) nextFilesMatch(kid string) bool {
	got, err := signingKeyID(r.Files.NextKey())
	if kid == "" || err != nil || got != kid {
		return false
	}
	_, err = r.Files.nextPublic(kid)
	return err == nil
}

func (r *Rotator) generate() (string, error) {
	priv, pub, err := generate(r.Algorithm)
	if err != nil {
		return "", err
	}
	// The private key is never readable by others, not even while written.
	if err := atomicfile.WriteFile(r.Files.NextKey(), priv, 0o600); err != nil {
		return "", err
	}
	if err := atomicfile.WriteFile(r.Files.NextPub(), pub, 0o600); err != nil {
		return "", err
	}
	return signingKeyID(r.Files.NextKey())
}

// publish makes the public key file hold the current key(s) and the next
// one, and publishes exactly those bytes, so that the example publisher
// (which publishes the file when it changes) agrees with us.
func (r *Rotator) publish(ctx context.Context, next string) error {
	cur, blocks, err := readPublic(r.Files.PublicKey)
	if err != nil {
		return err
	}
	nb, err := r.Files.nextPublic(next)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(blocks, func(b keystate.Item) bool { return b.KID == next }) {
		blocks = append(blocks, nb)
	}
	value, err := r.Files.writePublic(cur, blocks)
	if err != nil {
		return err
	}
	return r.Publish(ctx, value)
}

// install makes the next key the signing key: the current one is copied to
// the backup first, then the next one renamed over it. On a re-run after
// the rename it does nothing.
func (r *Rotator) install(st *State) error {
	cur, err := signingKeyID(r.Files.SigningKey)
	if err != nil {
		return err
	}
	switch cur {
	case st.Next:
		r.Log.WithField("step", StepInstall).Info("next key already installed as the signing key")
		return nil
	case st.Previous:
	default:
		return fmt.Errorf("%s holds key %s, neither the previous key %s nor the next %s: changed by hand? not touching it",
			r.Files.SigningKey, cur, st.Previous, st.Next)
	}
	if got, err := signingKeyID(r.Files.NextKey()); err != nil || got != st.Next {
		return fmt.Errorf("next key %s missing or changed (%v): it was trusted as %s; start over by deleting the rotation state", r.Files.NextKey(), err, st.Next)
	}
	data, err := os.ReadFile(r.Files.SigningKey)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(r.Files.Backup(), data, 0o600); err != nil {
		return err
	}
	if err := atomicfile.Replace(r.Files.NextKey(), r.Files.SigningKey); err != nil {
		return fmt.Errorf("install %s as %s: %w", r.Files.NextKey(), r.Files.SigningKey, err)
	}
	r.Log.WithFields(logrus.Fields{"step": StepInstall, "signing_key": r.Files.SigningKey, "backup": r.Files.Backup()}).Info("next key installed as the signing key; previous key kept as backup")
	return nil
}

func (r *Rotator) supersede(ctx context.Context, kid string, retireAfter time.Time, resumed string) error {
	if kid == "" {
		return nil
	}
	return r.Keys.Supersede(ctx, kid, retireAfter, resumed)
}

// Plan describes what Run would do from the stored state, without doing it.
func (r *Rotator) Plan(ctx context.Context) ([]string, error) {
	st, err := r.Store.Load(ctx)
	if err != nil {
		return nil, err
	}
	mark := func(done bool) string {
		if done {
			return "done   "
		}
		return "would  "
	}
	phase := Phase("")
	if st != nil && st.Phase != PhaseRetired {
		phase = st.Phase
	}
	order := map[Phase]int{"": 0, PhaseGenerated: 1, PhasePublished: 2, PhaseInstalling: 3, PhaseInstalled: 4}
	at := order[phase]
	next := "a new key"
	if st != nil && st.Next != "" && phase != "" {
		next = st.Next
	}
	state := "none"
	if st != nil {
		state = fmt.Sprintf("%s, previous %s, next %s, updated %s", st.Phase, st.Previous, st.Next, st.Updated.Format(time.RFC3339))
	}
	lines := []string{
		fmt.Sprintf("rotation of %s (state: %s)", r.Host, state),
		mark(at >= 1) + fmt.Sprintf("%s: write %s (%s, mode 0600) and %s", StepGenerate, r.Files.NextKey(), r.Algorithm, r.Files.NextPub()),
		mark(at >= 2) + fmt.Sprintf("%s: make %s hold the current and the next public key and publish it as this host's value", StepPublish, r.Files.PublicKey),
		mark(at >= 3) + fmt.Sprintf("%s: wait until every publishing host's trust record lists %s", StepWait, next),
		mark(at >= 4) + fmt.Sprintf("%s: copy %s to %s, rename %s over it (fsync)", StepInstall, r.Files.SigningKey, r.Files.Backup(), r.Files.NextKey()),
		mark(at >= 4) + fmt.Sprintf("%s: restart this apiserver through the lock", StepRestart),
		mark(at >= 4) + fmt.Sprintf("%s: keep the previous public key published as superseded until %s after the install (retire-keys, from any master, retires it then)", StepRecord, r.Grace),
	}
	switch {
	case phase == PhaseRollingBack:
		return []string{lines[0], "a rollback is under way: rotate-key --rollback finishes it (rotate-key alone refuses, exit 3)"}, nil
	case at == 4:
		lines = append(lines, fmt.Sprintf("nothing to do: previous key %s retires after %s; rotate-key --rollback would sign with it again until then", st.Previous, st.RetireAfter.Format(time.RFC3339)))
	case at >= 1:
		lines = append(lines, "rotate-key --abort would withdraw the next key instead, as long as it is not installed")
	}
	return lines, nil
}
