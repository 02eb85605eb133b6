package resource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/keysync/confd/template"
	"github.com/sirupsen/logrus"
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
}

// Process renders the resource from one snapshot and, when the result
// differs from the live file, stages, checks, replaces and reloads.
// The live file is only ever replaced by a file that passed its check.
func (r *Resource) Process(ctx context.Context, store Getter) (Result, error) {
	log := r.settings.log().WithField("resource", r.File)
	kvs, rev, err := store.GetValues(ctx, r.StoreKeys())
	if err != nil {
		return Result{}, fmt.Errorf("%s: read keys: %w", r.File, err)
	}
	res := Result{Revision: rev}
	content, err := template.Render(r.Src, r.stripPrefix(kvs), template.WithKeyring(r.settings.Keyring))
	if err != nil {
		return res, fmt.Errorf("%s: %w", r.File, err)
	}
	live, err := readLive(r.Dest)
	if err != nil {
		return res, fmt.Errorf("%s: %w", r.File, err)
	}
	mode := r.effectiveMode(live)
	if r.inSync(live, content, mode) {
		log.Debugf("Target config %s in sync", r.Dest)
		if r.reloadPending && !r.settings.Noop && !r.settings.SyncOnly {
			log.Infof("Retrying reload_cmd for %s, which failed after the last update", r.Dest)
			if err := r.reload(ctx, "", log); err != nil {
				return res, err
			}
			res.Reloaded = true
		}
		return res, nil
	}
	res.Changed = true
	log.Infof("Target config %s out of sync", r.Dest)
	if r.settings.Noop {
		log.Warnf("Noop mode enabled. %s will not be modified", r.Dest)
		if r.settings.DiffOut != nil {
			_, _ = r.settings.DiffOut.Write(describeChange(r.Dest, live, content, mode, r.UID, r.GID, r.settings.NoopShowSecrets))
		}
		return res, nil
	}
	stage, err := writeStage(r.Dest, content, mode, r.UID, r.GID)
	if err != nil {
		return res, fmt.Errorf("%s: %w", r.File, err)
	}
	removeStage := true
	defer func() {
		if removeStage {
			_ = os.Remove(stage)
		}
	}()
	if !r.settings.SyncOnly && r.CheckCmd != "" {
		if err := r.check(ctx, stage, log); err != nil {
			if r.settings.KeepStageFile {
				removeStage = false
				log.Infof("Keeping staged file: %s", stage)
			}
			return res, err
		}
	}
	log.Debugf("Overwriting target config %s", r.Dest)
	if err := replace(stage, r.Dest, content, mode, r.UID, r.GID, log); err != nil {
		return res, fmt.Errorf("%s: %w", r.File, err)
	}
	if !r.settings.SyncOnly && r.ReloadCmd != "" {
		r.reloadPending = true
		if err := r.reload(ctx, stage, log); err != nil {
			return res, err
		}
		res.Reloaded = true
	}
	log.Infof("Target config %s has been updated", r.Dest)
	return res, nil
}

// InheritState carries what old learnt at run time (a reload_cmd still
// owed) over to r, its replacement after the resource files were re-read.
func (r *Resource) InheritState(old *Resource) {
	if old.Dest == r.Dest {
		r.reloadPending = old.reloadPending
	}
}

// stripPrefix maps store keys to the template's view, as confd does:
// "/prefix/a/b" becomes "/a/b".
func (r *Resource) stripPrefix(kvs map[string]string) map[string]string {
	out := make(map[string]string, len(kvs))
	for k, v := range kvs {
		out[path.Join("/", strings.TrimPrefix(k, r.Prefix))] = v
	}
	return out
}

func (r *Resource) check(ctx context.Context, stage string, log logrus.FieldLogger) error {
	cmd, err := expandCommand("check_cmd", r.CheckCmd, stage, r.Dest)
	if err != nil {
		return fmt.Errorf("%s: check_cmd: %w", r.File, err)
	}
	log.Debugf("Running check_cmd %s", cmd)
	out, err := runCommand(ctx, cmd, r.CheckTimeout)
	if err != nil {
		return fmt.Errorf("%s: check_cmd failed, %s left unchanged: %w", r.File, r.Dest, err)
	}
	log.Debugf("check_cmd output: %s", out)
	return nil
}

func (r *Resource) reload(ctx context.Context, stage string, log logrus.FieldLogger) error {
	cmd, err := expandCommand("reload_cmd", r.ReloadCmd, stage, r.Dest)
	if err != nil {
		return fmt.Errorf("%s: reload_cmd: %w", r.File, err)
	}
	log.Debugf("Running reload_cmd %s", cmd)
	out, err := runCommand(ctx, cmd, r.ReloadTimeout)
	if err != nil {
		return fmt.Errorf("%s: %s was updated but reload_cmd failed (will retry): %w", r.File, r.Dest, err)
	}
	r.reloadPending = false
	log.Debugf("reload_cmd output: %s", out)
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
