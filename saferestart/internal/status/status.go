// Package status gathers what operators ask about: who holds the restart
// lock, who waits (in FIFO order), whether a hold stops the line, and where
// each host's key rotation stands (and whether its apiserver waits for a
// key to be trusted).
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// Report is the state of one lock and its hold key.
type Report struct {
	Lock     string       `json:"lock"`
	Revision int64        `json:"revision"`
	Holder   *lock.Entry  `json:"holder"`
	Waiters  []lock.Entry `json:"waiters"`
	HoldKey  string       `json:"hold_key"`
	// Hold is what stops the line: the hold record, and every orphaned
	// restart intent as a hold (hold.Active); nil: restarts are allowed.
	Hold *hold.Record `json:"hold"`
	// Intents are the restart intents under the hold key, live (a restart
	// under way) or orphaned (its helper died: counted in Hold).
	Intents []hold.Intent `json:"intents"`
	// RotationPrefix is where Rotations were read.
	RotationPrefix string `json:"rotation_prefix"`
	// Rotations are the hosts that have rotation records: the phase of
	// their last rotation, whether one runs, whether their apiserver
	// waits (wait-trusted) for a key to be trusted.
	Rotations []rotation.HostRecords `json:"rotations"`
	// KeysPrefix is where Keys were read.
	KeysPrefix string `json:"keys_prefix,omitempty"`
	// Keys are each host's current and superseded keys (with their retire
	// time), and whether forget-host removed it, sorted by host.
	Keys []keystate.HostKeys `json:"keys"`
}

// AddKeys reads every host's keys and key record through store.
func (r *Report) AddKeys(ctx context.Context, store *keystate.Store) error {
	life, err := store.List(ctx, 0)
	if err != nil {
		return err
	}
	r.KeysPrefix = store.KeysPrefix
	r.Keys = slices.AppendSeq(make([]keystate.HostKeys, 0, len(life)), maps.Values(life))
	slices.SortFunc(r.Keys, func(a, b keystate.HostKeys) int { return strings.Compare(a.Host, b.Host) })
	return nil
}

// Collect reads the lock queue, the hold, the restart intents and the
// rotation records under rotationPrefix.
func Collect(ctx context.Context, kv hold.Client, lockName, holdKey, rotationPrefix string) (*Report, error) {
	entries, rev, err := lock.Queue(ctx, kv, lockName)
	if err != nil {
		return nil, err
	}
	r := &Report{Lock: lockName, Revision: rev, HoldKey: holdKey, Waiters: []lock.Entry{}, RotationPrefix: rotationPrefix}
	if len(entries) > 0 {
		r.Holder = &entries[0]
		r.Waiters = append(r.Waiters, entries[1:]...)
		// How long a holder on a dead host keeps the line: best effort, a
		// report without it is still the report.
		_ = lock.FillTTL(ctx, kv, r.Holder)
	}
	// Every host's orphan counts: status speaks for the fleet, for which
	// the line is stopped (only the owner's own retry may go on).
	if r.Hold, r.Intents, err = hold.Active(ctx, kv, holdKey, ""); err != nil {
		return nil, err
	}
	if r.Rotations, err = rotation.List(ctx, kv, rotationPrefix); err != nil {
		return nil, err
	}
	return r, nil
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "lock:    %s (at revision %d)\n", r.Lock, r.Revision)
	if r.Holder == nil {
		b.WriteString("holder:  none\n")
	} else {
		fmt.Fprintf(&b, "holder:  %s\n", r.Holder)
		if a := r.Holder.Advice(); a != "" {
			fmt.Fprintf(&b, "         %s\n", a)
		}
	}
	if len(r.Waiters) == 0 {
		b.WriteString("waiters: none\n")
	} else {
		fmt.Fprintf(&b, "waiters: %d\n", len(r.Waiters))
		for i, e := range r.Waiters {
			fmt.Fprintf(&b, "  %d. %s\n", i+1, e)
		}
	}
	if r.Hold == nil {
		fmt.Fprintf(&b, "hold:    none (%s)\n", r.HoldKey)
	} else {
		fmt.Fprintf(&b, "hold:    ACTIVE (%s): %s\n", r.HoldKey, r.Hold)
		b.WriteString("         restarts are refused until `kube-apiserver-safe-restart unhold`\n")
	}
	for _, in := range r.Intents {
		state := "live (restart under way)"
		if in.Orphaned {
			state = "ORPHANED (its helper died mid-restart: holds every other host until its next successful restart or `unhold`)"
		}
		fmt.Fprintf(&b, "intent:  %s %s, started %s: %s\n", in.Host, state, in.Started.UTC().Format(time.RFC3339), in.What)
	}
	if len(r.Rotations) == 0 {
		fmt.Fprintf(&b, "rotations: none (%s)\n", r.RotationPrefix)
	} else {
		fmt.Fprintf(&b, "rotations: (%s)\n", r.RotationPrefix)
	}
	for _, h := range r.Rotations {
		fmt.Fprintf(&b, "  %s: %s\n", h.Host, h.Text())
	}
	if r.KeysPrefix != "" {
		if len(r.Keys) == 0 {
			fmt.Fprintf(&b, "keys: none published (%s)\n", r.KeysPrefix)
		} else {
			fmt.Fprintf(&b, "keys: (%s)\n", r.KeysPrefix)
		}
		for _, h := range r.Keys {
			fmt.Fprintf(&b, "  %s: %s\n", h.Host, h.Text())
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
