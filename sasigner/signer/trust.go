package signer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/trust"
)

// Recorder writes this host's trust record when the set its apiserver
// fetched changes, or the key kube-controller-manager signs with does (not
// on every FetchKeys call: the apiserver asks every refresh hint).
type Recorder struct {
	Client  func(context.Context) (*clientv3.Client, error)
	Prefix  string // trust prefix
	Host    string
	Timeout time.Duration
	Log     logrus.FieldLogger
	Metrics *Metrics
	// ControllerManager, if set, returns the key ID this host's
	// kube-controller-manager signs legacy token Secrets with (the record's
	// controller_manager_signing, which retire-keys keeps), asked at each
	// fetch; an error records none and is logged when it starts and ends.
	ControllerManager func() (string, error)

	latest atomic.Pointer[Snapshot]
	once   sync.Once
	wake   chan struct{}
}

// Fetched notes that the apiserver fetched s; it never blocks the call.
func (r *Recorder) Fetched(s *Snapshot) {
	r.latest.Store(s)
	select {
	case r.wakeup() <- struct{}{}:
	default:
	}
}

func (r *Recorder) wakeup() chan struct{} {
	r.once.Do(func() { r.wake = make(chan struct{}, 1) })
	return r.wake
}

// Run writes records until ctx ends; a failed write is retried.
func (r *Recorder) Run(ctx context.Context) {
	wake := r.wakeup()
	var (
		retry      <-chan time.Time // after a failed write; nil: none
		recorded   *Snapshot
		recordedCM string
		failing    bool
		cmErr      string
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-retry:
		}
		s := r.latest.Load()
		if s == nil {
			continue
		}
		cm := r.controllerManager(&cmErr)
		if recorded != nil && sameIDs(recorded.Keys, s.Keys) && recorded.Signing == s.Signing && recordedCM == cm {
			continue
		}
		h := sha256.New()
		for _, k := range s.Keys {
			h.Write(k.DER)
		}
		rec := trust.Record{Host: r.Host, Trusted: s.IDs(), Signing: s.Signing, ControllerManagerSigning: cm,
			BundleSHA256: hex.EncodeToString(h.Sum(nil)), Time: time.Now().UTC(), Source: trust.SignerSource}
		// Written through the trust package, as kube-apiserver-safe-restart
		// does, without a lock condition: the signer holds no restart lock.
		cli, err := r.Client(ctx)
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, r.Timeout)
			err = trust.Put(pctx, cli, r.Prefix, "", rec)
			cancel()
		}
		if err != nil {
			r.Metrics.recordErrs.WithLabelValues("write").Inc()
			if !failing {
				r.Log.WithError(err).Error("trust record not written; retrying")
			}
			failing = true
			retry = time.After(2 * time.Second)
			continue
		}
		if failing {
			r.Log.Info("trust record written again")
			failing = false
		}
		recorded, recordedCM = s, cm
		r.Log.WithField("trusted", rec.Trusted).WithField("signing", rec.Signing).WithField("controller_manager_signing", cm).
			Info("trust record written: the apiserver fetched a new key set, or the controller-manager's key changed")
	}
}

// controllerManager asks r.ControllerManager, logging a failure when it
// starts (or its reason changes) and when it ends; *last holds the
// failure logged last.
func (r *Recorder) controllerManager(last *string) string {
	if r.ControllerManager == nil {
		return ""
	}
	kid, err := r.ControllerManager()
	if err != nil {
		r.Metrics.recordErrs.WithLabelValues("controller_manager_key").Inc()
		if msg := err.Error(); msg != *last {
			*last = msg
			r.Log.WithError(err).Error("kube-controller-manager's signing key unreadable: the trust record names none, so retire-keys cannot see which key it signs with")
		}
		return ""
	}
	if *last != "" {
		*last = ""
		r.Log.WithField("kid", kid).Info("kube-controller-manager's signing key readable again")
	}
	return kid
}

// Barrier holds a new signing key until every host that has a trust
// record lists it: trust.Wait among the recorded hosts.
type Barrier struct {
	Client  func(context.Context) (*clientv3.Client, error)
	Prefix  string // trust prefix
	Timeout time.Duration
	Log     logrus.FieldLogger
}

// Wait returns nil once every host with a trust record lists kid; after
// b.Timeout, a *trust.NotTrustedError naming the hosts whose record does
// not; ctx's error when ctx ends first.
func (b *Barrier) Wait(ctx context.Context, kid string) error {
	tctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	_, err := trust.Wait(tctx, nil, trust.WaitOptions{
		Prefixes: trust.Prefixes{Trust: b.Prefix}, Among: trust.Recorded, Keys: []string{kid},
		Client: b.Client, Log: b.Log,
	})
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
