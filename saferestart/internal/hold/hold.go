// Package hold stores the "stop the line" record of kube-apiserver-safe-restart:
// one etcd key, without a lease so that it outlives the process that wrote it,
// whose presence makes every host refuse to restart until an operator removes it.
package hold

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Record says who stopped the line, when and why. It is stored as JSON.
type Record struct {
	Host   string    `json:"host"`
	PID    int       `json:"pid,omitempty"`
	User   string    `json:"user,omitempty"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
	// Lock is the lock name the writer was using.
	Lock string `json:"lock,omitempty"`
	// ExitCode is the exit status the writer ended with, when a failure set the hold.
	ExitCode int `json:"exit_code,omitempty"`
	// Raw is the stored value when it was not a JSON record (for example
	// written by hand with etcdctl put); such a value still holds the line.
	Raw string `json:"raw,omitempty"`
	// Revision is the etcd revision that last wrote the key (set on read).
	Revision int64 `json:"mod_revision,omitempty"`
	// Also are the reasons given after the first, by hosts or operators that
	// found the line already stopped: a hold is never overwritten.
	Also []Record `json:"also,omitempty"`
}

// String is a one-line description naming host, reason and time.
func (r *Record) String() string {
	if r == nil {
		return "no hold"
	}
	if r.Raw != "" {
		return fmt.Sprintf("hold with a value that is not a record: %q", r.Raw)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "host %s", cmp.Or(r.Host, "(unknown)"))
	if r.PID != 0 {
		fmt.Fprintf(&b, " (pid %d)", r.PID)
	}
	if r.User != "" {
		fmt.Fprintf(&b, " user %s", r.User)
	}
	fmt.Fprintf(&b, " at %s: %s", r.Time.UTC().Format(time.RFC3339), cmp.Or(r.Reason, "(unknown)"))
	if len(r.Also) > 0 {
		also := make([]string, len(r.Also))
		for i := range r.Also {
			also[i] = r.Also[i].String()
		}
		fmt.Fprintf(&b, " (and %d later: %s)", len(r.Also), strings.Join(also, "; "))
	}
	return b.String()
}

// decode turns the stored key-value in kvs, if any, into a record; nil
// when there is none. A value that is not a JSON object is kept in Raw
// rather than ignored.
func decode(kvs []*mvccpb.KeyValue) *Record {
	if len(kvs) == 0 {
		return nil
	}
	var r Record
	if err := json.Unmarshal(kvs[0].Value, &r); err != nil || (r.Host == "" && r.Reason == "") {
		r = Record{Raw: string(kvs[0].Value)}
	} else {
		r.Raw = ""
	}
	r.Revision = kvs[0].ModRevision
	return &r
}

// Get reads the hold at key; it returns nil and no error when there is none.
func Get(ctx context.Context, kv clientv3.KV, key string) (*Record, error) {
	resp, err := kv.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read hold %s: %w", key, err)
	}
	return decode(resp.Kvs), nil
}

// Add stops the line with r, with no lease. A hold already there is never
// overwritten: r is kept beside it (in Also), so that an operator's reason,
// or the first failure, survives a later one. It needs no lock: each write
// is a compare-and-swap on the key's revision. It returns the record as
// stored.
func Add(ctx context.Context, kv clientv3.KV, key string, r Record) (*Record, error) {
	r.Revision, r.Raw, r.Also = 0, "", nil
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	for {
		resp, err := kv.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("write hold %s: read: %w", key, err)
		}
		stored, rev := r, int64(0)
		if prev := decode(resp.Kvs); prev != nil {
			rev = prev.Revision
			if prev.Raw != "" {
				// A value written by hand stays first, as a reason.
				prev = &Record{Reason: "hold value set by hand: " + prev.Raw}
			}
			prev.Revision = 0
			prev.Also = append(prev.Also, r)
			stored = *prev
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false) // reasons quote shell commands: keep > and & readable
		if err := enc.Encode(stored); err != nil {
			return nil, err
		}
		txn, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strings.TrimSpace(buf.String()))).Commit()
		if err != nil {
			return nil, fmt.Errorf("write hold %s: %w", key, err)
		}
		if txn.Succeeded {
			stored.Revision = txn.Header.Revision
			return &stored, nil
		}
		// Someone wrote it in between: add to what they wrote.
	}
}

// Delete removes the hold and returns the record it removed, or nil when
// there was none.
func Delete(ctx context.Context, kv clientv3.KV, key string) (*Record, error) {
	resp, err := kv.Delete(ctx, key, clientv3.WithPrevKV())
	if err != nil {
		return nil, fmt.Errorf("delete hold %s: %w", key, err)
	}
	return decode(resp.PrevKvs), nil
}
