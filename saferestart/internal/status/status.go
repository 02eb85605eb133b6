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
	"strings"
	"time"

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
}

// Collect reads the lock queue, the hold, the restart intents and the
// rotation records under rotationPrefix.
func Collect(ctx context.Context, kv hold.Client, lockName, holdKey, rotationPrefix string) (*Report, error) {
	entries, rev, err := lock.Queue(ctx, kv, lockName)
	if err != nil {
		return nil, err
	}
	r := &Report{Lock: lockName, Revision: rev, HoldKey: holdKey, Waiters: []lock.Entry{}}
	if len(entries) > 0 {
		r.Holder = &entries[0]
		r.Waiters = append(r.Waiters, entries[1:]...)
		// How long a holder on a dead host keeps the line: best effort, a
		// report without it is still the report.
		_ = lock.FillTTL(ctx, kv, r.Holder)
	}
	// Every host's orphan counts: status speaks for the fleet, for which
	// the line is stopped (only the owner's own retry may go on).
	if r.Hold, err = hold.Active(ctx, kv, holdKey, ""); err != nil {
		return nil, err
	}
	if r.Intents, err = hold.Intents(ctx, kv, holdKey); err != nil {
		return nil, err
	}
	r.RotationPrefix = rotationPrefix
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
		fmt.Fprintf(&b, "  %s: %s\n", h.Host, rotationText(h))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// rotationText is one host's rotation records in a line.
func rotationText(h rotation.HostRecords) string {
	var parts []string
	switch {
	case h.StateError != "":
		parts = append(parts, "state UNREADABLE: "+h.StateError)
	case h.State != nil:
		st := h.State
		p := fmt.Sprintf("phase %s (next %s, previous %s, updated %s", st.Phase, st.Next, st.Previous, st.Updated.UTC().Format(time.RFC3339))
		if st.Phase == rotation.PhaseInstalled && !st.RetireAfter.IsZero() {
			p += ", previous key retired after " + st.RetireAfter.UTC().Format(time.RFC3339)
		}
		parts = append(parts, p+")")
	default:
		parts = append(parts, "no rotation recorded")
	}
	if h.Rotating {
		parts = append(parts, "a rotate-key or retire-keys runs now")
	}
	if h.Waiting != nil {
		parts = append(parts, fmt.Sprintf("its apiserver WAITS for key %s to be trusted (wait-trusted since %s, pid %d)",
			strings.Join(h.Waiting.Keys, ", "), h.Waiting.Since.UTC().Format(time.RFC3339), h.Waiting.PID))
	}
	return strings.Join(parts, "; ")
}
