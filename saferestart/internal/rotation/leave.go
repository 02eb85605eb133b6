package rotation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/internal/keystate"
)

// ErrState is an operation the rotation's stored state does not allow
// (abort after the install, rollback before it or after the retirement,
// key files missing): nothing was changed, and a re-run changes nothing.
var ErrState = errors.New("not possible in this rotation state")

func stateErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrState, fmt.Sprintf(format, a...))
}

// Check makes sure the host's key files are there and hold what a
// rotation needs: one private key in SigningKey, public keys in PublicKey.
// Its error wraps ErrState: a missing file is not worth retrying.
func (f Files) Check() error {
	if _, err := signingKeyID(f.SigningKey); err != nil {
		return stateErr("signing key (--signing-key): %v", err)
	}
	if _, _, err := readPublic(f.PublicKey); err != nil {
		return stateErr("public key (--public-key): %v", err)
	}
	return nil
}

// Abort abandons a rotation before its next key is installed: the next key
// leaves the public key file and this host's published value, its files
// are removed and the state is cleared. Every host then drops it at its
// next restart; nothing ever signed with it.
func (r *Rotator) Abort(ctx context.Context) error {
	st, err := r.Store.Load(ctx)
	if err != nil {
		return err
	}
	switch {
	case st == nil || st.Phase == "" || st.Phase == PhaseRetired:
		return stateErr("no rotation in progress on %s: nothing to abort", r.Host)
	case st.Phase == PhaseInstalled:
		return stateErr("the next key %s is installed already (%s): use rotate-key --rollback to sign with %s again while it is still trusted",
			st.Next, st.Installed.Format(time.RFC3339), st.Previous)
	case st.Phase == PhaseRollingBack:
		return stateErr("a rollback is under way: re-run rotate-key --rollback")
	}
	cur, err := signingKeyID(r.Files.SigningKey)
	if err != nil {
		return stateErr("signing key (--signing-key): %v", err)
	}
	switch cur {
	case st.Previous:
	case st.Next:
		return stateErr("%s already holds the next key %s: use rotate-key --rollback", r.Files.SigningKey, st.Next)
	default:
		return stateErr("%s holds key %s, neither the previous key %s nor the next %s: changed by hand? not touching it", r.Files.SigningKey, cur, st.Previous, st.Next)
	}
	log := r.Log.WithFields(logrus.Fields{"next": st.Next, "signing": cur})
	if st.Next != "" {
		// Nothing signed with the next key: it is retired at once rather
		// than superseded, and never published again.
		if err := r.Keys.Withdraw(ctx, st.Next); err != nil {
			return fmt.Errorf("withdraw the next key %s: %w", st.Next, err)
		}
		value, err := r.withoutKey(st.Next)
		if err != nil {
			return err
		}
		if err := r.Publish(ctx, value); err != nil {
			return fmt.Errorf("publish %s without the next key: %w", r.Files.PublicKey, err)
		}
		log.Infof("next key %s withdrawn from %s and from this host's published value", st.Next, r.Files.PublicKey)
	}
	// The next key's files go, the private key scrubbed.
	if err := scrub(r.Files.NextKey(), r.Files.SigningKey); err != nil {
		return err
	}
	if err := os.Remove(r.Files.NextPub()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := atomicfile.SyncDir(filepath.Dir(r.Files.NextPub())); err != nil {
		return err
	}
	// Last: a rotation killed before this is aborted again by a re-run.
	if err := r.Store.Clear(ctx); err != nil {
		return err
	}
	r.removeTemporaries()
	log.Infof("rotation aborted: %s signs with %s as before; every apiserver drops the next key at its next restart", r.Host, cur)
	return nil
}

// withoutKey rewrites the public key file without kid and returns what it
// now holds, the value to publish.
func (r *Rotator) withoutKey(kid string) ([]byte, error) {
	data, blocks, err := readPublic(r.Files.PublicKey)
	if err != nil {
		return nil, err
	}
	keep := slices.DeleteFunc(blocks, func(b keystate.Item) bool { return b.KID == kid })
	if len(keep) == 0 {
		return nil, fmt.Errorf("%s holds no key but %s: not publishing an empty value", r.Files.PublicKey, kid)
	}
	return r.Files.writePublic(data, keep)
}

// Rollback puts the previous signing key back after an install, while the
// previous key is still published (before retire-keys): the two keys swap
// places (sa.key.previous then holds the rolled-back key) and the apiserver
// restarts through the lock, its trust gate included. The state becomes an
// installed rotation with the roles swapped, so that retire-keys withdraws
// the rolled-back key after the grace period: tokens it signed stay valid
// until then.
func (r *Rotator) Rollback(ctx context.Context) error {
	st, err := r.Store.Load(ctx)
	if err != nil {
		return err
	}
	if st == nil || st.Phase == "" {
		return stateErr("no rotation on %s: nothing to roll back", r.Host)
	}
	cur, err := signingKeyID(r.Files.SigningKey)
	if err != nil {
		return stateErr("signing key (--signing-key): %v", err)
	}
	switch st.Phase {
	case PhaseGenerated, PhasePublished:
		return stateErr("the next key %s is not installed: use rotate-key --abort", st.Next)
	case PhaseRetired:
		return stateErr("the previous key %s was retired (no longer published, so no longer trusted everywhere): rotate again instead", st.Previous)
	case PhaseInstalling:
		if cur == st.Previous {
			return stateErr("the next key %s is not installed yet: use rotate-key --abort", st.Next)
		}
	case PhaseInstalled, PhaseRollingBack:
	default:
		return fmt.Errorf("rotation state has unknown phase %q", st.Phase)
	}
	if gone, err := r.Keys.Retired(ctx, st.Previous); err != nil {
		return err
	} else if gone {
		return stateErr("the previous key %s was retired (tombstoned by retire-keys, no longer trusted everywhere): rotate again instead", st.Previous)
	}
	log := r.Log.WithFields(logrus.Fields{"previous": st.Previous, "next": st.Next})
	switch cur {
	case st.Next:
		if got, err := signingKeyID(r.Files.Backup()); err != nil || got != st.Previous {
			return stateErr("%s does not hold the previous key %s (%v, %s): cannot roll back", r.Files.Backup(), st.Previous, err, got)
		}
		if st.Phase != PhaseRollingBack {
			st.Phase, st.Updated = PhaseRollingBack, time.Now().UTC()
			if err := r.Store.Save(ctx, *st); err != nil {
				return err
			}
		}
		if err := r.swapBack(); err != nil {
			return stepErr(StepInstall, err)
		}
		log.Infof("previous key %s is the signing key again; the rolled-back key %s is kept in %s", st.Previous, st.Next, r.Files.Backup())
	case st.Previous:
		if st.Phase != PhaseRollingBack {
			return stateErr("%s already holds the previous key %s", r.Files.SigningKey, st.Previous)
		}
		log.Info("previous key already back as the signing key")
	default:
		return stateErr("%s holds key %s, neither the previous key %s nor the next %s: changed by hand? not touching it", r.Files.SigningKey, cur, st.Previous, st.Next)
	}
	log.WithField("step", StepRestart).Info("restarting this apiserver through the lock to sign with the previous key again")
	if err := r.Restart(ctx); err != nil {
		return stepErr(StepRestart, err)
	}
	now := time.Now().UTC()
	back := State{Host: st.Host, Phase: PhaseInstalled, Algorithm: st.Algorithm, Previous: st.Next, Next: st.Previous,
		Grace: r.Grace.String(), Started: st.Started, Updated: now, Installed: now, RetireAfter: now.Add(r.Grace), RolledBack: true}
	// The key signing again is current again; the rolled-back one is
	// superseded with the rollback's retire time.
	if err := r.supersede(ctx, back.Previous, back.RetireAfter, back.Next); err != nil {
		return stepErr(StepRecord, err)
	}
	if err := r.Store.Save(ctx, back); err != nil {
		return stepErr(StepRecord, err)
	}
	r.removeTemporaries()
	r.Log.WithFields(logrus.Fields{"signing": back.Next, "rolled_back": back.Previous, "retire_after": back.RetireAfter.Format(time.RFC3339)}).
		Infof("rollback done: key %s signs again; the rolled-back key %s stays published until %s (retire-keys)", back.Next, back.Previous, back.RetireAfter.Format(time.RFC3339))
	return nil
}

// swapBack makes the backup the signing key and keeps the signing key as
// the backup. A crash between the two writes leaves the previous key in
// both (the rolled-back private key is then gone, which nothing needs).
func (r *Rotator) swapBack() error {
	prev, err := os.ReadFile(r.Files.Backup())
	if err != nil {
		return err
	}
	next, err := os.ReadFile(r.Files.SigningKey)
	if err != nil {
		return err
	}
	// A private key: never wider than 0600, whatever the file had.
	if err := atomicfile.WriteFile(r.Files.SigningKey, prev, modeOf(r.Files.SigningKey, 0o600)&0o600); err != nil {
		return err
	}
	return atomicfile.WriteFile(r.Files.Backup(), next, 0o600)
}

// scrub removes a private key file: overwritten with zeros, fsynced,
// unlinked, the directory fsynced. Best effort against recovery: a
// journalling or copy-on-write file system, or an SSD's remapping, may
// keep the old blocks. A file with other links (or the same file as keep)
// is only unlinked: overwriting it would destroy the other name's key.
func scrub(path, keep string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	shared := !st.Mode().IsRegular()
	if s, ok := st.Sys().(*syscall.Stat_t); ok && s.Nlink > 1 {
		shared = true
	}
	if ks, err := os.Stat(keep); err == nil && os.SameFile(st, ks) {
		shared = true
	}
	if !shared {
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			_, werr := f.Write(make([]byte, st.Size()))
			serr := f.Sync()
			cerr := f.Close()
			if err := errors.Join(werr, serr, cerr); err != nil {
				return fmt.Errorf("overwrite %s: %w", path, err)
			}
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// removeTemporaries removes what a killed write left beside the key files
// (atomicfile's stage files) and the next public key once it is no longer
// needed: no temporary file outlives a finished rotation. Best effort.
func (r *Rotator) removeTemporaries() {
	for _, p := range []string{r.Files.SigningKey, r.Files.PublicKey, r.Files.NextKey(), r.Files.NextPub(), r.Files.Backup()} {
		tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".*"))
		for _, tmp := range tmps {
			if atomicfile.StageOf(filepath.Base(tmp)) != filepath.Base(p) {
				continue
			}
			if err := scrub(tmp, r.Files.SigningKey); err != nil {
				r.Log.WithError(err).Warnf("cannot remove %s", tmp)
			}
		}
	}
	if err := os.Remove(r.Files.NextPub()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.Log.WithError(err).Warnf("cannot remove %s", r.Files.NextPub())
	}
}
