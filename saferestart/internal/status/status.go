// Package status gathers what operators ask about: who holds the restart
// lock, who waits (in FIFO order), and whether a hold stops the line.
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
}

// Collect reads the lock queue, the hold and the restart intents.
func Collect(ctx context.Context, kv hold.Client, lockName, holdKey string) (*Report, error) {
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
	_, err := io.WriteString(w, b.String())
	return err
}
