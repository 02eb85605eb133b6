package rotation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/keysync/confd/internal/etcdkey"
)

// DefaultPrefix is where rotation state lives: PREFIX/HOST/state and, while
// a rotation runs, PREFIX/HOST/owner.
const DefaultPrefix = "/kubernetes/service-account-keys-rotation"

// Phase is the last step a rotation completed.
type Phase string

const (
	// PhaseGenerated: the next key pair is written beside the current one.
	PhaseGenerated Phase = "generated"
	// PhasePublished: this host publishes the current and the next public key.
	PhasePublished Phase = "published"
	// PhaseInstalling: every host trusts the next key; it is being installed
	// as the signing key and the apiserver restarted.
	PhaseInstalling Phase = "installing"
	// PhaseInstalled: the apiserver signs with the next key; the previous
	// public key stays published until RetireAfter.
	PhaseInstalled Phase = "installed"
	// PhaseRetired: the previous public key is no longer published.
	PhaseRetired Phase = "retired"
	// PhaseRollingBack: rotate-key --rollback puts the previous key back as
	// the signing key and restarts; Previous and Next are still the
	// rotation's. Once done the state is PhaseInstalled with the two keys'
	// roles swapped (RolledBack set).
	PhaseRollingBack Phase = "rolling-back"
)

// State is one host's rotation record. It names keys by ID only.
type State struct {
	Host        string    `json:"host"`
	Phase       Phase     `json:"phase"`
	Algorithm   string    `json:"algorithm"`
	Previous    string    `json:"previous"` // key ID signing when the rotation started
	Next        string    `json:"next"`     // key ID of the key being rotated in
	Grace       string    `json:"grace"`
	Started     time.Time `json:"started"`
	Updated     time.Time `json:"updated"`
	Installed   time.Time `json:"installed,omitempty"`
	RetireAfter time.Time `json:"retire_after,omitempty"`
	// RolledBack: this installed state is a rollback: Next is the key
	// signing before the rotation, Previous the rolled-back one.
	RolledBack bool `json:"rolled_back,omitempty"`
}

// Store keeps one host's rotation state.
type Store interface {
	Load(ctx context.Context) (*State, error)
	Save(ctx context.Context, s State) error
	// Clear removes the state (an aborted rotation).
	Clear(ctx context.Context) error
}

// EtcdStore is Store on etcd, at PREFIX/HOST/state.
type EtcdStore struct {
	KV     clientv3.KV
	Prefix string
	Host   string
}

// Key is the state's etcd key.
func (s *EtcdStore) Key() string { return etcdkey.Join(s.Prefix, s.Host, "state") }

// Load returns the stored state, nil when there is none.
func (s *EtcdStore) Load(ctx context.Context) (*State, error) {
	resp, err := s.KV.Get(ctx, s.Key())
	if err != nil {
		return nil, fmt.Errorf("read rotation state %s: %w", s.Key(), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var st State
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
		return nil, fmt.Errorf("rotation state %s is not a rotation record: %w (delete it with etcdctl del to start over)", s.Key(), err)
	}
	return &st, nil
}

// Save writes the state.
func (s *EtcdStore) Save(ctx context.Context, st State) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if _, err := s.KV.Put(ctx, s.Key(), string(data)); err != nil {
		return fmt.Errorf("write rotation state %s: %w", s.Key(), err)
	}
	return nil
}

// Clear deletes the state.
func (s *EtcdStore) Clear(ctx context.Context) error {
	if _, err := s.KV.Delete(ctx, s.Key()); err != nil {
		return fmt.Errorf("delete rotation state %s: %w", s.Key(), err)
	}
	return nil
}

// ErrBusy means another rotation of the same host is running.
var ErrBusy = errors.New("another rotation of this host is running")

type owner struct {
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// Acquire claims host's rotation: the right to rotate its key is the
// owner record PREFIX/HOST/owner on a lease of ttl seconds, so that a
// killed rotation gives it up within the TTL; Withdraw gives it up. When
// another process holds it, it waits up to wait for that claim to go (a
// killed rotation's lease expiring), then returns an error wrapping
// ErrBusy that names the holder.
func Acquire(ctx context.Context, cli *clientv3.Client, prefix, host, self string, ttl int, wait time.Duration) (*Announcement, error) {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("rotation claim: etcd session: %w", err)
	}
	key := etcdkey.Join(prefix, host, "owner")
	val, _ := json.Marshal(owner{Host: self, PID: os.Getpid(), Started: time.Now().UTC()})
	deadline := time.Now().Add(wait)
	for {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(sess.Lease()))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			sess.Close()
			return nil, fmt.Errorf("rotation claim %s: %w", key, err)
		}
		if resp.Succeeded {
			return &Announcement{sess: sess, key: key, what: "rotation claim"}, nil
		}
		kv := resp.Responses[0].GetResponseRange().Kvs
		holder := "(gone)"
		if len(kv) > 0 {
			holder = string(kv[0].Value)
		}
		left := time.Until(deadline)
		if left <= 0 {
			sess.Close()
			return nil, fmt.Errorf("%w: %s holds %s", ErrBusy, holder, key)
		}
		// Sleep on the owner key until it changes or the wait is over.
		wctx, cancel := context.WithTimeout(ctx, left)
		select {
		case <-cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)):
		case <-wctx.Done():
		}
		cancel()
		if ctx.Err() != nil {
			sess.Close()
			return nil, ctx.Err()
		}
	}
}
