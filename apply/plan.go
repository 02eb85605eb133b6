package apply

import (
	"context"
	"fmt"
	"os"

	"github.com/kelseyhightower/memkv"

	kvstore "github.com/keysync/confd/store"
	"github.com/keysync/confd/template"
)

// Plan is what one pass over a resource would do, worked out without
// touching anything: the rendered file and whether it differs from the
// live one, and whether a reload_cmd is still owed from an earlier update.
type Plan struct {
	Revision int64 // store revision the content was rendered from
	Content  template.Text
	Mode     os.FileMode
	UID, GID int
	// Write is set when the live file's content, mode or owner differ.
	Write bool
	// ReloadOwed is set when an earlier pass replaced the live file (it now
	// holds what that pass wrote) but its reload_cmd has not yet succeeded.
	ReloadOwed bool
	// staleOwed is an owed-reload record for content that never went live
	// (the process died between recording and renaming): nothing is owed.
	staleOwed bool
	// inPlace: the record names an in-place write that may have been cut
	// short (repairInPlace settles it).
	inPlace bool
	live    liveFile
}

// Release frees what the plan's content holds (a large render's file).
func (p *Plan) Release() { p.Content.Release() }

// GetPairs reads a snapshot of keys from store as a list: through store's
// own GetPairs when it has one (etcd's: the list may repeat keys and is
// often already in key order), so that a large snapshot needs no map on
// its way to the index.
func GetPairs(ctx context.Context, store Getter, keys []string) ([]memkv.KVPair, int64, error) {
	if pg, ok := store.(interface {
		GetPairs(context.Context, []string) ([]memkv.KVPair, int64, error)
	}); ok {
		return pg.GetPairs(ctx, keys)
	}
	kvs, rev, err := store.GetValues(ctx, keys)
	return kvstore.PairsOf(kvs), rev, err
}

// Plan reads one snapshot of the resource's keys, renders the template and
// compares the result with the live file and the owed-reload record. The
// caller releases a plan that returned no error (Plan.Release).
func (r *File) Plan(ctx context.Context, store Getter) (Plan, error) {
	pairs, rev, err := GetPairs(ctx, store, r.StoreKeys())
	if err != nil {
		return Plan{}, fmt.Errorf("%s: read keys: %w", r.File, err)
	}
	p := Plan{Revision: rev, UID: r.UID, GID: r.GID}
	warn := func(msg string) { r.s.Logger().WithField("resource", r.File).Warn(msg) }
	if p.Content, err = r.s.Renderer.RenderIndex(r.Src, r.index(pairs), template.Options{Keyring: r.s.Keyring, Warn: warn}); err != nil {
		return p, fmt.Errorf("%s: %w", r.File, err)
	}
	if err := r.compare(&p); err != nil {
		p.Release()
		return p, err
	}
	return p, nil
}

// compare sets what p would do from the live file and the owed-reload
// record as they are now: Process compares again once it holds the
// destination's lock, as another process may have written the file since.
func (r *File) compare(p *Plan) (err error) {
	if p.live, err = readLive(r.Dest); err != nil {
		return fmt.Errorf("%s: %w", r.File, err)
	}
	// The destination's mode is the resource's, else the live file's, else 0644.
	switch {
	case r.Mode != 0:
		p.Mode = r.Mode
	case p.live.exists:
		p.Mode = p.live.mode
	default:
		p.Mode = 0o644
	}
	p.Write = !(p.live.exists && p.live.mode == p.Mode && p.live.uid == r.UID && p.live.gid == r.GID && p.Content.Equal(p.live.content))
	owed, err := readOwed(r.Dest)
	if err != nil {
		return fmt.Errorf("%s: %w", r.File, err)
	}
	p.inPlace = owed.inPlace != nil
	recorded := owed.exists && (len(owed.sums) > 0 || !owed.valid) // not just an in-place write's line
	// Owed only if the live file is what the recording pass installed;
	// an unreadable record counts as owed: a spare reload is better
	// than a lost one.
	p.ReloadOwed = recorded && (!owed.valid || p.live.exists && owed.covers(p.live.content))
	p.staleOwed = recorded && !p.ReloadOwed
	return nil
}
