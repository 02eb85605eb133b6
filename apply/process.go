package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/kelseyhightower/memkv"
	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/resource"
	kvstore "github.com/keysync/confd/store"
	"github.com/keysync/confd/template"
)

// Getter reads a consistent snapshot of keys; backends.StoreClient is one.
type Getter interface {
	GetValues(ctx context.Context, keys []string) (map[string]string, int64, error)
}

// Result says what one pass over a resource did.
type Result struct {
	Revision int64 // store revision the file was rendered from
	Changed  bool  // the destination was (or, with -noop, would be) replaced
	Reloaded bool  // reload_cmd ran and succeeded
	// Replaced is when the writer's Replace returned with the new content
	// at the destination (the rename and its directory fsync, or the
	// write in place, done; also when only that fsync failed); zero when
	// the destination was not replaced.
	Replaced time.Time
}

// Process plans and applies one pass: render from one snapshot and, when
// the result differs from the live file, stage, check, replace and reload;
// a reload still owed from an earlier pass runs even when nothing changed.
// The live file is only ever replaced by a file that passed its check.
//
// A pass that has something to do (unless -noop) holds the destination's
// lock from there to the end of reload_cmd, and compares with the live
// file again under it: another confd's pass over the same file (an
// operator's -onetime beside the daemon) waits, then finds the file in sync
// rather than staging, replacing and reloading a second time. A pass in
// sync takes no lock: it writes and runs nothing.
func (r *File) Process(ctx context.Context, store Getter) (Result, error) {
	p, err := r.Plan(ctx, store)
	if err != nil {
		return Result{Revision: p.Revision}, err
	}
	defer p.Release()
	if !r.s.Noop && (p.Write || p.ReloadOwed || p.staleOwed || p.inPlace) {
		log := r.s.Logger().WithField("resource", r.File)
		l, err := lockDest(ctx, cmp.Or(r.s.LockDir, DefaultLockDir()), r.Dest, cmp.Or(r.s.DestLockTimeout, DefaultDestLockTimeout), r.s.Stop, log)
		if err != nil {
			return Result{Revision: p.Revision}, fmt.Errorf("%s: %w", r.File, err)
		}
		defer l.Close()
		// A file torn by an in-place write that a crash interrupted is
		// restored before anything else reads or replaces it.
		if err := repairInPlace(r.Dest, log); err != nil {
			log.Warn(err.Error())
		}
		if err := r.compare(&p); err != nil {
			return Result{Revision: p.Revision}, err
		}
	}
	return r.Apply(ctx, p)
}

// Apply carries out a plan with the settings' Writer and Runner.
func (r *File) Apply(ctx context.Context, p Plan) (Result, error) {
	log := r.s.Logger().WithField("resource", r.File)
	s := r.s
	w := s.writer()
	res := Result{Revision: p.Revision}
	if !p.Write {
		log.Debugf("Target config %s in sync", r.Dest)
		return res, r.settleOwed(ctx, p, &res, log)
	}
	res.Changed = true
	log.Infof("Target config %s out of sync", r.Dest)
	if s.Noop {
		log.Warnf("Noop mode enabled. %s will not be modified", r.Dest)
		if p.ReloadOwed && r.ReloadCmd != "" {
			log.Warnf("Noop mode enabled. reload_cmd for %s, owed since an earlier update, will not be run", r.Dest)
		}
		if s.DiffOut != nil {
			_, _ = s.DiffOut.Write(p.Diff(r.Dest, r.s.NoopShowSecrets))
		}
		return res, nil
	}
	stage, err := w.Stage(r.Dest, p.Content, p.Mode, p.UID, p.GID)
	if err != nil {
		return res, fmt.Errorf("%s: %w; %s left unchanged", r.File, err, r.Dest)
	}
	removeStage := true
	defer func() {
		if removeStage {
			_ = os.Remove(stage)
		}
	}()
	if !s.SyncOnly && r.CheckCmd != "" {
		if err := r.check(ctx, stage, log); err != nil {
			if s.KeepStageFile {
				if kept, kerr := keepStage(stage, r.Dest, p.Mode); kerr != nil {
					log.Warnf("%v", kerr)
				} else {
					removeStage = false
					log.Infof("Keeping staged file: %s", kept)
				}
			}
			return res, err
		}
	}
	// A reload is owed from the moment the rename succeeds: record it
	// before, so that no crash, failed fsync or signal in between loses it.
	// With -sync-only no reload is owed by this update, but one owed from
	// before is carried over to the new content.
	owe := r.ReloadCmd != "" && (!s.SyncOnly || p.ReloadOwed)
	if owe {
		contents := []template.Text{p.Content}
		if p.ReloadOwed && p.live.exists {
			contents = append(contents, template.TextOf(p.live.content))
		}
		if err := w.MarkOwed(r.Dest, contents...); err != nil {
			return res, fmt.Errorf("%s: %w; %s left unchanged", r.File, err, r.Dest)
		}
	}
	log.Debugf("Overwriting target config %s", r.Dest)
	err = w.Replace(stage, r.Dest, p.Content, p.Mode, p.UID, p.GID)
	if _, nd := errors.AsType[*atomicfile.NotDurableError](err); err != nil && !nd {
		if owe && !p.ReloadOwed {
			if cerr := w.ClearOwed(r.Dest); cerr != nil {
				log.Warnf("%v; a spare reload_cmd may run on the next run", cerr)
			}
		}
		return res, fmt.Errorf("%s: %w", r.File, err)
	}
	res.Replaced = time.Now() // when only its directory's fsync failed too
	if err != nil && owe {
		return res, fmt.Errorf("%s: %s was replaced, but %w; its reload_cmd is owed and will be retried on the next run", r.File, r.Dest, err)
	} else if err != nil {
		return res, fmt.Errorf("%s: %s was replaced, but %w", r.File, r.Dest, err)
	}
	// A refused file kept from an earlier pass is obsolete now, and may
	// hold the very key its check refused.
	if kept := keptStagePath(r.Dest); os.Remove(kept) == nil {
		log.Infof("Removed %s, kept from an earlier failed check", kept)
	}
	if owe && s.SyncOnly {
		log.Warnf("reload_cmd for %s, owed since an earlier update, is not run with -sync-only; it is retried on the next run without it", r.Dest)
	} else if owe {
		if err := r.reload(ctx, stage, log); err != nil {
			return res, err
		}
		res.Reloaded = true
	}
	log.Infof("Target config %s has been updated", r.Dest)
	return res, nil
}

// settleOwed runs (or, in -noop and -sync-only, reports) a reload owed from
// an earlier update of a file that is now in sync, and drops stale records.
func (r *File) settleOwed(ctx context.Context, p Plan, res *Result, log logrus.FieldLogger) error {
	s := r.s
	switch {
	case !p.ReloadOwed && !p.staleOwed:
		return nil
	case s.Noop:
		if p.ReloadOwed {
			log.Warnf("Noop mode enabled. reload_cmd for %s, owed since an earlier update, will not be run", r.Dest)
		}
		return nil
	case p.staleOwed:
		log.Debugf("Dropping the owed-reload record of %s: the content it was for never went live", r.Dest)
		return s.writer().ClearOwed(r.Dest)
	case r.ReloadCmd == "":
		log.Warnf("A reload of %s is owed since an earlier update, but the resource has no reload_cmd any more; dropping it", r.Dest)
		return s.writer().ClearOwed(r.Dest)
	case s.SyncOnly:
		log.Warnf("reload_cmd for %s, owed since an earlier update, is not run with -sync-only; it is retried on the next run without it", r.Dest)
		return nil
	}
	log.Infof("Running reload_cmd for %s, owed since an earlier update", r.Dest)
	err := r.reload(ctx, "", log)
	res.Reloaded = err == nil
	return err
}

// index maps store keys to the template's view, as confd does ("/prefix/a/b"
// becomes "/a/b"), and indexes them for the render. It takes pairs over:
// keys are rewritten in place, sharing the store key's bytes where they are
// already clean. Two store keys can become one template key ("/p/a" and
// "/p/a/"): the index keeps one of them, the same on every run.
func (r *File) index(pairs []memkv.KVPair) *kvstore.Index {
	for i := range pairs {
		pairs[i].Key = templateKey(pairs[i].Key, r.Prefix)
	}
	return kvstore.FromPairs(pairs)
}

// templateKey is path.Join("/", strings.TrimPrefix(key, prefix)) without
// the copy when the result is already clean: path.Clean returns such a
// string as it is. The rest of the key is used with the slash before it
// when there is one, which is the case of every key under a prefix ending
// in "/", such as "/", every resource's prefix when none is set: a copy
// per key there cost 100k allocations and 2.4 MB kept for 100k keys.
func templateKey(key, prefix string) string {
	rest := strings.TrimPrefix(key, prefix)
	if strings.HasPrefix(rest, "/") {
		return path.Clean(rest)
	}
	if cut := len(key) - len(rest); cut > 0 && key[cut-1] == '/' {
		return path.Clean(key[cut-1:]) // "/" + rest
	}
	return path.Join("/", rest)
}

func (r *File) check(ctx context.Context, stage string, log logrus.FieldLogger) error {
	cmd, err := resource.ExpandCommand("check_cmd", r.CheckCmd, stage, r.Dest)
	if err != nil {
		return fmt.Errorf("%s: check_cmd: %w", r.File, err)
	}
	if r.stopping(ctx) {
		return fmt.Errorf("%s: confd is stopping: check_cmd was not started; %s left unchanged", r.File, r.Dest)
	}
	log.Debugf("Running check_cmd %s", cmd)
	if err := r.runCommand(ctx, "check_cmd", cmd, r.CheckTimeout, []string{stage, r.Dest}, log.Debugf, log); err != nil {
		return fmt.Errorf("%s: check_cmd failed, %s left unchanged: %w", r.File, r.Dest, err)
	}
	return nil
}

// stopping reports that no command may start any more: ctx ended, or the
// daemon's first SIGTERM closed Settings.Stop (commands already running
// keep their own context until a second signal).
func (r *File) stopping(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-r.s.Stop:
		return true
	default:
		return false
	}
}

// reload runs reload_cmd for a file that is live and clears the owed
// record when it succeeds.
func (r *File) reload(ctx context.Context, stage string, log logrus.FieldLogger) error {
	cmd, err := resource.ExpandCommand("reload_cmd", r.ReloadCmd, stage, r.Dest)
	if err != nil {
		return fmt.Errorf("%s: reload_cmd: %w; it is owed and will be retried on the next run", r.File, err)
	}
	if r.stopping(ctx) {
		return fmt.Errorf("%s: %s is updated, but confd is stopping: its reload_cmd was not started; it is owed and will be retried on the next run", r.File, r.Dest)
	}
	log.Debugf("Running reload_cmd %s", cmd)
	if err := r.runCommand(ctx, "reload_cmd", cmd, r.ReloadTimeout, []string{r.Dest}, log.Infof, log); err != nil {
		return fmt.Errorf("%s: %s is updated, but reload_cmd failed; it is owed and will be retried on the next run: %w", r.File, r.Dest, err)
	}
	if err := r.s.writer().ClearOwed(r.Dest); err != nil {
		return fmt.Errorf("%s: reload_cmd succeeded, but %w; it will run once more on the next run", r.File, err)
	}
	return nil
}

type liveFile struct {
	exists   bool
	content  []byte
	mode     os.FileMode
	uid, gid int
}

func readLive(dest string) (liveFile, error) {
	fi, err := os.Stat(dest)
	if errors.Is(err, fs.ErrNotExist) {
		return liveFile{}, nil
	}
	if err != nil {
		return liveFile{}, fmt.Errorf("dest: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return liveFile{}, fmt.Errorf("dest %s is not a regular file", dest)
	}
	b, err := os.ReadFile(dest)
	if err != nil {
		return liveFile{}, fmt.Errorf("dest: %w", err)
	}
	lf := liveFile{exists: true, content: b, mode: fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		lf.uid, lf.gid = int(st.Uid), int(st.Gid)
	}
	return lf, nil
}
