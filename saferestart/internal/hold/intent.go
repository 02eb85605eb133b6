package hold

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An intent is what a helper records, under the lock and before its
// restart command starts, at <hold-key>/intent/<host>: "this host's
// apiserver is about to go down". It is a plain put, with no lease, so that
// it outlives a helper SIGKILLed mid-restart (whose restart goes on in
// systemd or the kubelet, and whose lock lease then expires). The helper
// deletes it once the health gate passed, or once a failure is recorded as
// a hold. An intent whose owner's lock lease is gone is therefore a restart
// nobody saw end: another host takes it as a hold naming the owner.

// Client is what reading intents needs: the keys, and the leases that tell
// a live owner from a dead one. *clientv3.Client is one.
type Client interface {
	clientv3.KV
	clientv3.Lease
}

// Intent is one host's record of a restart under way. It is stored as JSON.
type Intent struct {
	Host string `json:"host"`
	PID  int    `json:"pid,omitempty"`
	// Lease is the lock session's lease: the intent is live while it is.
	Lease int64 `json:"lease"`
	// LockKey is the owner's mutex key (NAME/<lease hex>).
	LockKey string    `json:"lock_key,omitempty"`
	Started time.Time `json:"started"`
	// What the owner was about to run.
	What string `json:"what,omitempty"`

	// Set on read.
	Key      string `json:"key,omitempty"`
	Revision int64  `json:"mod_revision,omitempty"`
	// Orphaned: the owner's lease is gone (or the value is not a record),
	// so the restart's end was never seen.
	Orphaned bool `json:"orphaned"`
	// Raw is the stored value when it was not a JSON record.
	Raw string `json:"raw,omitempty"`
}

// IntentPrefix is where the intents of holdKey's hosts live. It is under
// holdKey plus a slash, so that the exact read of the hold key never sees
// them.
func IntentPrefix(holdKey string) string { return holdKey + "/intent/" }

func IntentKey(holdKey, host string) string { return IntentPrefix(holdKey) + host }

// DeleteIntent removes host's intent; it reports whether there was one.
// It is the owner's own clean-up after a restart whose end it saw, and the
// hook for `forget-host` (issue 34): a host that is gone for good can never
// clear its own orphaned intent.
func DeleteIntent(ctx context.Context, kv clientv3.KV, holdKey, host string) (bool, error) {
	key := IntentKey(holdKey, host)
	resp, err := kv.Delete(ctx, key)
	if err != nil {
		return false, fmt.Errorf("delete restart intent %s: %w", key, err)
	}
	return resp.Deleted > 0, nil
}

// Intents lists the intents under holdKey, each marked Orphaned when its
// owner's lease is gone.
func Intents(ctx context.Context, c Client, holdKey string) ([]Intent, error) {
	prefix := IntentPrefix(holdKey)
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read restart intents %s: %w", prefix, err)
	}
	out := make([]Intent, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var in Intent
		if err := json.Unmarshal(kv.Value, &in); err != nil || in.Host == "" {
			// Not ours (written by hand?): it names its host by its key,
			// and no lease can show it live.
			in = Intent{Host: strings.TrimPrefix(string(kv.Key), prefix), Raw: string(kv.Value)}
		}
		in.Key, in.Revision = string(kv.Key), kv.ModRevision
		alive, err := leaseAlive(ctx, c, in.Lease)
		if err != nil {
			return nil, fmt.Errorf("restart intent %s: lease %x: %w", in.Key, in.Lease, err)
		}
		in.Orphaned = !alive
		out = append(out, in)
	}
	return out, nil
}

// leaseAlive asks etcd whether lease still exists. A gone lease is TTL -1
// (or, from some servers, "lease not found").
func leaseAlive(ctx context.Context, c clientv3.Lease, lease int64) (bool, error) {
	if lease == 0 {
		return false, nil
	}
	resp, err := c.TimeToLive(ctx, clientv3.LeaseID(lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return resp.TTL >= 0, nil
}

// AsHold is an orphaned intent as the hold it amounts to: it names the
// host, when its restart started, and what clears it.
func (in Intent) AsHold() Record {
	what := cmp.Or(in.What, "its restart")
	if in.Raw != "" {
		what = fmt.Sprintf("a value that is not a record: %q", in.Raw)
	}
	return Record{
		Host: in.Host, PID: in.PID, Time: in.Started,
		Reason: fmt.Sprintf("the helper on %s died mid-restart (intent %s: %s; its lock lease %x is gone): its apiserver may still be down. "+
			"%s's next successful restart clears this; or check that apiserver and `unhold`", cmp.Or(in.Host, "(unknown)"), in.Key, what, in.Lease, cmp.Or(in.Host, "(unknown)")),
	}
}

// Active is what stops the line for host self, and the intents it read:
// the hold at holdKey with every orphaned intent of a host other than self
// (self's own is what its retry clears, so it does not stop self) after it,
// in Also; without a hold the first orphan is the record. nil: nothing
// holds. self "" counts every orphan (status: the line is stopped for the
// others).
func Active(ctx context.Context, c Client, holdKey, self string) (*Record, []Intent, error) {
	rec, err := Get(ctx, c, holdKey)
	if err != nil {
		return nil, nil, err
	}
	intents, err := Intents(ctx, c, holdKey)
	if err != nil {
		return nil, nil, err
	}
	for _, in := range intents {
		if !in.Orphaned || (self != "" && in.Host == self) {
			continue
		}
		if h := in.AsHold(); rec == nil {
			rec = &h
		} else {
			rec.Also = append(rec.Also, h)
		}
	}
	return rec, intents, nil
}

// ClearOrphans removes every orphaned intent (unhold), each only if it is
// unchanged since it was read: a host that has just written a new, live
// intent keeps it. A live intent belongs to a restart under way, which
// clears it itself. It returns the intents removed.
func ClearOrphans(ctx context.Context, c Client, holdKey string) ([]Intent, error) {
	intents, err := Intents(ctx, c, holdKey)
	if err != nil {
		return nil, err
	}
	var removed []Intent
	for _, in := range intents {
		if !in.Orphaned {
			continue
		}
		txn, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(in.Key), "=", in.Revision)).
			Then(clientv3.OpDelete(in.Key)).Commit()
		if err != nil {
			return removed, fmt.Errorf("delete restart intent %s: %w", in.Key, err)
		}
		if txn.Succeeded {
			removed = append(removed, in)
		}
	}
	return removed, nil
}

// Store is the hold record and this host's intent, as the restart state
// machine uses them (restart.Holds).
type Store struct {
	C       Client
	HoldKey string
	// Host is this host: its own orphaned intent does not hold it.
	Host string
}

func (s *Store) Key() string { return s.HoldKey }

// Get is the hold, or another host's orphaned intent taken as one.
func (s *Store) Get(ctx context.Context) (*Record, error) {
	rec, _, err := Active(ctx, s.C, s.HoldKey, s.Host)
	return rec, err
}

func (s *Store) Add(ctx context.Context, r Record) error {
	_, err := Add(ctx, s.C, s.HoldKey, r)
	return err
}

// SetIntent records this host's restart as under way: in, with no lease,
// at the host's intent key (replacing its earlier intent: a host's new run
// is what clears its old one).
func (s *Store) SetIntent(ctx context.Context, in Intent) error {
	if s.Host == "" {
		return errors.New("intent without a host")
	}
	in.Host, in.Key, in.Revision, in.Orphaned, in.Raw = s.Host, "", 0, false, ""
	in.Started = in.Started.UTC()
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	key := IntentKey(s.HoldKey, s.Host)
	if _, err := s.C.Put(ctx, key, string(b)); err != nil {
		return fmt.Errorf("write restart intent %s: %w", key, err)
	}
	return nil
}

func (s *Store) ClearIntent(ctx context.Context) error {
	_, err := DeleteIntent(ctx, s.C, s.HoldKey, s.Host)
	return err
}
