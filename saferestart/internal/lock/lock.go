// Package lock holds the restart lock: an etcd concurrency.Mutex under a
// lock name, so that it excludes and queues with `etcdctl lock <name>`, in a
// session whose lease also carries a small record of who is waiting or
// holding (host, pid, start time) for `status` to show.
//
// Key layout for lock name N:
//
//	N/<lease hex>       mutex keys (exactly as etcdctl lock); the one with the
//	                    lowest create revision holds the lock, the others wait
//	                    in create-revision order. Empty value, on the lease.
//	N-info/<lease hex>  JSON Info of a participant using this package, on the
//	                    same lease, so it vanishes with the holder or waiter.
package lock

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ErrLeaseLost means the session lease is no longer kept alive: it expired
// or could not be refreshed, so the lock (if it was held) may now belong to
// someone else.
var ErrLeaseLost = errors.New("session lease lost")

// Prefix is the prefix of the mutex keys for name, as concurrency.NewMutex
// and etcdctl lock build it.
func Prefix(name string) string { return name + "/" }

// InfoPrefix is the prefix of the participant records for name. It must not
// share Prefix(name), or the records would join the mutex queue.
func InfoPrefix(name string) string { return name + "-info/" }

// Info describes a participant (waiter or holder).
type Info struct {
	Host     string     `json:"host"`
	PID      int        `json:"pid"`
	Started  time.Time  `json:"started"`
	Acquired *time.Time `json:"acquired,omitempty"`
	Version  string     `json:"version,omitempty"`
}

// Config says which lock to take and how.
type Config struct {
	Name string
	// TTL of the session lease in seconds.
	TTL int
	// OpTimeout bounds each single etcd request.
	OpTimeout time.Duration
	Info      Info
}

// Session is one lease with (eventually) one held mutex.
type Session struct {
	cli  *clientv3.Client
	cfg  Config
	sess *concurrency.Session
	mu   *concurrency.Mutex
	rev  int64 // where the lock was acquired (etcdctl's ETCD_LOCK_REV)
	// relMu serialises Release and Abandon: a signal handler and the normal
	// path may both try to let go.
	relMu sync.Mutex
	held  bool

	// lost ends (lose, idempotent) when the lock must be taken as lost:
	// by the lease monitor (monitor) or the watch on our own mutex key
	// (watchKey).
	lost      context.Context
	lose      context.CancelFunc
	stopWatch context.CancelFunc
}

// Open grants a lease of cfg.TTL, keeps it alive, and publishes cfg.Info
// under the lease. Nothing is queued yet.
func Open(ctx context.Context, cli *clientv3.Client, cfg Config) (*Session, error) {
	if cfg.Name == "" {
		return nil, errors.New("empty lock name")
	}
	if cfg.TTL < 1 {
		return nil, fmt.Errorf("lease TTL %d s: must be at least 1", cfg.TTL)
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	gctx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
	granted := time.Now() // the lease cannot expire before this plus TTL
	lease, err := cli.Grant(gctx, int64(cfg.TTL))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("grant session lease (TTL %ds): %w", cfg.TTL, err)
	}
	// The lease is granted here, under a deadline; NewSession would grant
	// with the client's context, which has none.
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(cfg.TTL), concurrency.WithLease(lease.ID))
	if err != nil {
		revoke(cli, lease.ID, cfg.OpTimeout)
		return nil, fmt.Errorf("keep session lease %x alive: %w", lease.ID, err)
	}
	s := &Session{cli: cli, cfg: cfg, sess: sess, mu: concurrency.NewMutex(sess, cfg.Name), stopWatch: func() {}}
	s.lost, s.lose = context.WithCancel(context.Background())
	go s.monitor(granted)
	if err := s.putInfo(ctx); err != nil {
		sess.Orphan()
		revoke(cli, lease.ID, cfg.OpTimeout)
		return nil, err
	}
	return s, nil
}

func revoke(cli *clientv3.Client, id clientv3.LeaseID, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, _ = cli.Revoke(ctx, id)
}

func (s *Session) putInfo(ctx context.Context) error {
	data, err := json.Marshal(s.cfg.Info)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	key := InfoPrefix(s.cfg.Name) + s.LeaseHex()
	if _, err := s.cli.Put(pctx, key, string(data), clientv3.WithLease(s.sess.Lease())); err != nil {
		return fmt.Errorf("publish holder info %s: %w", key, err)
	}
	return nil
}

func (s *Session) Lease() clientv3.LeaseID { return s.sess.Lease() }

// LeaseHex is the lease as etcd tools print it (and as it ends the mutex key).
func (s *Session) LeaseHex() string { return strconv.FormatInt(int64(s.sess.Lease()), 16) }

// Key is the mutex key, NAME/<lease hex>; what etcdctl passes as ETCD_LOCK_KEY.
func (s *Session) Key() string { return Prefix(s.cfg.Name) + s.LeaseHex() }

// Env is what the command run under the lock gets, as with etcdctl lock.
func (s *Session) Env() []string {
	return []string{"ETCD_LOCK_KEY=" + s.Key(), "ETCD_LOCK_REV=" + strconv.FormatInt(s.rev, 10)}
}

// Done closes when the lease must be taken as lost (revoked or expired, or
// no refresh confirmed by etcd for TTL minus SafetyMargin), or was given up
// by Release/Abandon.
func (s *Session) Done() <-chan struct{} { return s.lost.Done() }

// Lost reports whether Done is closed.
func (s *Session) Lost() bool { return s.lost.Err() != nil }

// SafetyMargin is how long before the lease can expire on the server the
// holder gives it up: a quarter of the TTL, between 250 ms and 2 s. It is
// the time the holder has to stop its command before another host can
// take the lock.
func SafetyMargin(ttl int) time.Duration {
	return min(max(time.Duration(ttl)*time.Second/4, 250*time.Millisecond), 2*time.Second)
}

// Margin is this session's SafetyMargin.
func (s *Session) Margin() time.Duration { return SafetyMargin(s.cfg.TTL) }

// monitor declares the lease lost before etcd can expire it. The client
// library only notices a lost lease once the TTL has passed since the last
// refresh it saw, which is when etcd may already have given the lock to the
// next host: two holders at once. Here every refresh is confirmed with its
// own KeepAliveOnce, and when none has been confirmed for TTL minus margin
// (measured from when the confirmed request was sent, so the server's
// expiry is later still) the lease is taken as lost.
func (s *Session) monitor(lastOK time.Time) {
	defer s.lose() // every way out of here is the loss of the lease
	ttl, margin := time.Duration(s.cfg.TTL)*time.Second, s.Margin()
	period := max(ttl/5, 100*time.Millisecond)
	deadline := time.NewTimer(time.Until(lastOK.Add(ttl - margin)))
	defer deadline.Stop()
	tick := time.NewTicker(period)
	defer tick.Stop()
	type probe struct {
		sent time.Time
		err  error
	}
	results := make(chan probe, 1)
	inflight := false
	for {
		select {
		case <-s.sess.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
			if inflight {
				continue
			}
			inflight = true
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), period)
				defer cancel()
				sent := time.Now()
				_, err := s.cli.KeepAliveOnce(ctx, s.sess.Lease())
				results <- probe{sent, err}
			}()
		case r := <-results:
			inflight = false
			switch {
			case r.err == nil:
				lastOK = r.sent
				deadline.Reset(time.Until(lastOK.Add(ttl - margin)))
			case errors.Is(r.err, rpctypes.ErrLeaseNotFound):
				return
			}
		}
	}
}

// Lock queues for the mutex (FIFO by create revision) and returns once it is
// held. It returns ctx's error when ctx ends first (the waiter key is then
// removed, as concurrency.Mutex does), and an error wrapping ErrLeaseLost
// when the lease is lost while waiting.
func (s *Session) Lock(ctx context.Context) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.lost, cancel)()
	errc := make(chan error, 1)
	go func() { errc <- s.mu.Lock(lctx) }()
	var err error
	select {
	case err = <-errc:
	case <-lctx.Done():
		// On cancellation Mutex.Lock deletes its waiter key using the
		// client's context, which has no deadline: wait for that at most
		// one request timeout (revoking the lease removes the key anyway).
		select {
		case err = <-errc:
		case <-time.After(s.cfg.OpTimeout):
			err = lctx.Err()
		}
	}
	if s.Lost() || errors.Is(err, concurrency.ErrSessionExpired) {
		return fmt.Errorf("waiting for lock %s: %w (lease %s)", s.Key(), ErrLeaseLost, s.LeaseHex())
	}
	if err := cmp.Or(ctx.Err(), err); err != nil {
		return fmt.Errorf("waiting for lock %s: %w", s.Key(), err)
	}
	s.rev = s.mu.Header().Revision
	s.relMu.Lock()
	s.held = true
	wctx, stop := context.WithCancel(s.lost)
	s.stopWatch = stop
	s.relMu.Unlock()
	go s.watchKey(wctx)
	now := time.Now().UTC()
	s.cfg.Info.Acquired = &now
	// Best effort: status shows since when the lock is held.
	_ = s.putInfo(context.WithoutCancel(ctx))
	return nil
}

// watchKey treats the deletion of our mutex key (`etcdctl del`, an
// operator clearing a stuck lock) as the loss of the lock: the next waiter
// now holds it, whatever our lease says.
func (s *Session) watchKey(ctx context.Context) {
	wc := s.cli.Watch(ctx, s.mu.Key(), clientv3.WithRev(s.rev+1))
	for {
		select {
		case <-ctx.Done(): // stopped, or the lease lost
			return
		case resp, ok := <-wc:
			if !ok {
				return
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					s.lose()
					return
				}
			}
			if resp.Err() != nil {
				// Compacted or cancelled: the lease monitor still guards us.
				return
			}
		}
	}
}

// Release unlocks (only if our mutex key is still the one we created) and
// revokes the lease, removing the info record. When the lease is already
// lost it touches nothing in etcd and returns ErrLeaseLost: a lock we no
// longer hold is never released.
func (s *Session) Release(ctx context.Context) error {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	s.stopWatch()
	if s.Lost() {
		s.held = false
		return fmt.Errorf("release lock %s: %w (lease %s); not touching it", s.Key(), ErrLeaseLost, s.LeaseHex())
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if s.held {
		uctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		_, err := s.cli.Txn(uctx).If(s.mu.IsOwner()).Then(clientv3.OpDelete(s.mu.Key())).Commit()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("unlock %s: %w", s.Key(), err))
		}
		s.held = false
	}
	s.sess.Orphan()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	_, err := s.cli.Revoke(rctx, s.sess.Lease())
	cancel()
	if err != nil {
		errs = append(errs, fmt.Errorf("revoke lease %s: %w", s.LeaseHex(), err))
	}
	return errors.Join(errs...)
}

// Abandon stops refreshing the lease without revoking it or deleting
// anything: for a lease that is lost (or may be), where touching the lock
// could release someone else's.
func (s *Session) Abandon() {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	s.stopWatch()
	s.held = false
	s.sess.Orphan()
}

// Entry is one mutex key: the holder (first) or a waiter.
type Entry struct {
	Key            string `json:"key"`
	Lease          string `json:"lease"`
	CreateRevision int64  `json:"create_revision"`
	// Info is nil for participants that publish none (etcdctl lock).
	Info *Info `json:"info,omitempty"`
	// TTL is the seconds its lease has left, as etcd answered FillTTL; 0
	// when not asked or not known. A holder on a dead host keeps the lock
	// until then, and that is the operator's question.
	TTL int64 `json:"ttl_seconds,omitempty"`
}

// FillTTL asks etcd how long e's lease has left and records it in e.TTL.
// An error, or a lease already gone, leaves TTL 0: the caller reports
// the entry without it.
func FillTTL(ctx context.Context, l clientv3.Lease, e *Entry) error {
	id, err := strconv.ParseInt(e.Lease, 16, 64)
	if err != nil || id == 0 {
		return fmt.Errorf("entry %s has no lease", e.Key)
	}
	resp, err := l.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return fmt.Errorf("lease %s of %s: %w", e.Lease, e.Key, err)
	}
	if resp.TTL > 0 {
		e.TTL = resp.TTL
	}
	return nil
}

// Advice says, for the holder of the lock, when it frees itself should its
// host be gone: the key and lease alone left the operator to work out that
// nothing needs deleting, only waiting. "" when TTL is not known.
func (e Entry) Advice() string {
	if e.TTL <= 0 {
		return ""
	}
	who := "its holder"
	if e.Info != nil && e.Info.Host != "" {
		who = "host " + e.Info.Host
	}
	return fmt.Sprintf("its lease expires in %ds; if %s is gone, the lock frees itself then", e.TTL, who)
}

// String describes the entry on one line.
func (e Entry) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (lease %s", e.Key, e.Lease)
	if e.TTL > 0 {
		fmt.Fprintf(&b, ", %ds left", e.TTL)
	}
	fmt.Fprintf(&b, ", created at revision %d)", e.CreateRevision)
	if e.Info == nil {
		b.WriteString(": no holder info (etcdctl lock or another client)")
		return b.String()
	}
	fmt.Fprintf(&b, ": host %s pid %d started %s", e.Info.Host, e.Info.PID, e.Info.Started.UTC().Format(time.RFC3339))
	if e.Info.Acquired != nil {
		fmt.Fprintf(&b, " holding since %s", e.Info.Acquired.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// Queue lists the mutex keys of name in FIFO order (the first holds the
// lock), with the info of those that published one, read at one revision.
func Queue(ctx context.Context, kv clientv3.KV, name string) ([]Entry, int64, error) {
	resp, err := kv.Txn(ctx).Then(
		clientv3.OpGet(Prefix(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		clientv3.OpGet(InfoPrefix(name), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("list lock %s: %w", name, err)
	}
	infos := map[int64]*Info{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var in Info
		if json.Unmarshal(kv.Value, &in) != nil || kv.Lease == 0 {
			continue
		}
		infos[kv.Lease] = &in
	}
	var out []Entry
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		e := Entry{Key: string(kv.Key), CreateRevision: kv.CreateRevision, Info: infos[kv.Lease]}
		if kv.Lease != 0 {
			e.Lease = strconv.FormatInt(kv.Lease, 16)
		}
		out = append(out, e)
	}
	return out, resp.Header.Revision, nil
}
