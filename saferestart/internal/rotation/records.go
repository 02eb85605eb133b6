package rotation

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/keysync/confd/internal/etcdkey"
)

// Waiting is a host's "my apiserver waits for these keys to be trusted"
// record, at PREFIX/HOST/waiting, written by wait-trusted for as long as it
// waits. It is bound to a lease, so that it vanishes when the waiting
// process dies: a record outliving its waiter would excuse a host that is
// down for another reason. The fleet check reads it: a restart that makes
// this host's apiserver trust those keys must not be refused because the
// waiting host's apiserver is not serving, since it is exactly that restart
// the waiting host waits for.
type Waiting struct {
	Host  string    `json:"host"`
	Keys  []string  `json:"keys"` // key IDs waited for
	Since time.Time `json:"since"`
	PID   int       `json:"pid"`
}

func (w Waiting) String() string {
	return fmt.Sprintf("%s waits for key %s to be trusted (since %s, pid %d)", w.Host, strings.Join(w.Keys, ", "), w.Since.UTC().Format(time.RFC3339), w.PID)
}

// WaitingKey is host's waiting record's etcd key.
func WaitingKey(prefix, host string) string { return etcdkey.Join(prefix, host, "waiting") }

// Announcement is a record on its lease: a waiting or alive record, or a
// rotation claim.
type Announcement struct {
	sess      *concurrency.Session
	key, what string
}

// Announce writes w at PREFIX/HOST/waiting on a new lease of ttl seconds,
// kept alive until Withdraw (or until the process dies: then the record
// goes within ttl).
func Announce(ctx context.Context, cli *clientv3.Client, prefix string, ttl int, w Waiting) (*Announcement, error) {
	return announce(ctx, cli, WaitingKey(prefix, w.Host), "waiting record", ttl, w)
}

// Alive is a host's "my key publisher runs" record, at PREFIX/HOST/alive,
// written by publish-key --watch for as long as it runs and bound to its
// lease: it goes when the publisher dies. forget-host refuses a host that
// has one (its publisher would publish its keys again).
type Alive struct {
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
	Version string    `json:"version"`
}

// AliveKey is host's alive record's etcd key.
func AliveKey(prefix, host string) string { return etcdkey.Join(prefix, host, "alive") }

// AnnounceAlive writes a at PREFIX/HOST/alive on a new lease of ttl
// seconds, kept alive until Withdraw. Keep-alives renew the lease and make
// no revision.
func AnnounceAlive(ctx context.Context, cli *clientv3.Client, prefix string, ttl int, a Alive) (*Announcement, error) {
	return announce(ctx, cli, AliveKey(prefix, a.Host), "alive record", ttl, a)
}

// announce writes v as JSON at key on a new lease of ttl seconds.
func announce(ctx context.Context, cli *clientv3.Client, key, what string, ttl int, v any) (*Announcement, error) {
	// The lease is granted within ctx; its keep-alive outlives ctx (an
	// etcd request's deadline) and ends at Withdraw.
	lease, err := cli.Grant(ctx, int64(ttl))
	if err != nil {
		return nil, fmt.Errorf("%s %s: etcd lease: %w", what, key, err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(ttl), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		_, _ = cli.Revoke(ctx, lease.ID)
		return nil, fmt.Errorf("%s %s: etcd lease keep-alive: %w", what, key, err)
	}
	val, err := json.Marshal(v)
	if err != nil {
		sess.Close()
		return nil, err
	}
	if _, err := cli.Put(ctx, key, string(val), clientv3.WithLease(sess.Lease())); err != nil {
		sess.Close()
		return nil, fmt.Errorf("write %s %s: %w", what, key, err)
	}
	return &Announcement{sess: sess, key: key, what: what}, nil
}

// Key is the record's etcd key.
func (a *Announcement) Key() string { return a.key }

// Lost is closed when the record's lease is gone (etcd lost it, or the
// keep-alive failed for longer than its TTL): announce again.
func (a *Announcement) Lost() <-chan struct{} { return a.sess.Done() }

// Withdraw removes the record: its lease is revoked.
func (a *Announcement) Withdraw() error {
	if err := a.sess.Close(); err != nil {
		return fmt.Errorf("remove %s %s (it goes by itself when its lease expires): %w", a.what, a.key, err)
	}
	return nil
}

// HostRecords is what the rotation prefix holds for one host.
type HostRecords struct {
	Host string `json:"host"`
	// State is the host's rotation state (nil: none recorded);
	// StateError says why a record there could not be read.
	State      *State `json:"state,omitempty"`
	StateError string `json:"state_error,omitempty"`
	// Rotating: a rotate-key or retire-keys of this host runs (its
	// lease-bound owner key is there).
	Rotating bool `json:"rotating,omitempty"`
	// Waiting is the host's waiting record (nil: no wait-trusted waits).
	Waiting *Waiting `json:"waiting,omitempty"`
	// Alive is the host's alive record (nil: no publish-key --watch runs
	// there).
	Alive *Alive `json:"alive,omitempty"`
}

// List reads every host's records under prefix at one revision, sorted by
// host. A record that does not parse is reported, not fatal: one host's
// bad record must not hide the others'.
func List(ctx context.Context, kv clientv3.KV, prefix string) ([]HostRecords, error) {
	resp, err := kv.Get(ctx, etcdkey.Dir(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read rotation records under %s: %w", etcdkey.Dir(prefix), err)
	}
	byHost := map[string]*HostRecords{}
	for _, k := range resp.Kvs {
		host, what, ok := strings.Cut(strings.TrimPrefix(string(k.Key), etcdkey.Dir(prefix)), "/")
		if !ok || host == "" {
			continue
		}
		h := byHost[host]
		if h == nil {
			h = &HostRecords{Host: host}
		}
		switch what {
		case "state":
			var st State
			if err := json.Unmarshal(k.Value, &st); err != nil {
				h.StateError = fmt.Sprintf("%s is not a rotation record: %v", k.Key, err)
			} else {
				h.State = &st
			}
		case "owner":
			h.Rotating = true
		case "waiting":
			var w Waiting
			if err := json.Unmarshal(k.Value, &w); err != nil {
				// Still a waiter: what it waits for is unknown.
				w = Waiting{Host: host}
			}
			h.Waiting = &w
		case "alive":
			var a Alive
			if err := json.Unmarshal(k.Value, &a); err != nil {
				// Still running: who it is is unknown.
				a = Alive{Host: host}
			}
			h.Alive = &a
		default:
			continue
		}
		byHost[host] = h
	}
	out := make([]HostRecords, 0, len(byHost))
	for _, h := range byHost {
		out = append(out, *h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

// Text is the host's rotation records in a line.
func (h HostRecords) Text() string {
	var parts []string
	switch {
	case h.StateError != "":
		parts = append(parts, "state UNREADABLE: "+h.StateError)
	case h.State != nil:
		st := h.State
		p := fmt.Sprintf("phase %s (next %s, previous %s, updated %s", st.Phase, st.Next, st.Previous, st.Updated.UTC().Format(time.RFC3339))
		if st.Phase == PhaseInstalled && !st.RetireAfter.IsZero() {
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
