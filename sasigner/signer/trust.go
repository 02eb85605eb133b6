package signer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/trust"
)

// RecordOf is the record of a host whose apiserver fetched s at t, and
// whose kube-controller-manager signs with cm ("" when unknown).
func RecordOf(host string, s *Snapshot, cm string, t time.Time) trust.Record {
	h := sha256.New()
	for _, k := range s.Keys {
		h.Write(k.DER)
	}
	return trust.Record{Host: host, Trusted: s.IDs(), Signing: s.Signing, ControllerManagerSigning: cm,
		BundleSHA256: hex.EncodeToString(h.Sum(nil)), Time: t.UTC(), Source: trust.SignerSource}
}

// ClientFunc returns the etcd client, waiting for a connection.
type ClientFunc func(context.Context) (*clientv3.Client, error)

// Recorder writes this host's trust record when the set its apiserver
// fetched changes, or the key kube-controller-manager signs with does (not
// on every FetchKeys call: the apiserver asks every refresh hint).
type Recorder struct {
	Client  ClientFunc
	Prefix  string // trust prefix, with its trailing slash
	Host    string
	Timeout time.Duration
	Log     logrus.FieldLogger
	Metrics *Metrics
	// ControllerManager, if set, returns the key ID this host's
	// kube-controller-manager signs legacy token Secrets with, for the
	// record's controller_manager_signing (retire-keys refuses to retire
	// a key a controller-manager still signs with). It is asked at each
	// fetch, so that a controller-manager restarted with another key is
	// recorded within a refresh hint; an error records no key (the record
	// then blocks nothing) and is logged when it starts and when it ends.
	ControllerManager func() (string, error)

	mu     sync.Mutex
	latest *Snapshot
	wake   chan struct{}
	// Written, if set, is called after each record is written (tests).
	Written func(trust.Record)
}

// Fetched notes that the apiserver fetched s; it never blocks the call.
func (r *Recorder) Fetched(s *Snapshot) {
	r.mu.Lock()
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	r.latest = s
	wake := r.wake
	r.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default:
	}
}

// Run writes records until ctx ends; a failed write is retried.
func (r *Recorder) Run(ctx context.Context) {
	r.mu.Lock()
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	wake := r.wake
	r.mu.Unlock()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	var (
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
		case <-retry.C:
		}
		r.mu.Lock()
		s := r.latest
		r.mu.Unlock()
		if s == nil {
			continue
		}
		cm := r.controllerManager(&cmErr)
		if recorded != nil && sameIDs(recorded.Keys, s.Keys) && recorded.Signing == s.Signing && recordedCM == cm {
			continue
		}
		rec := RecordOf(r.Host, s, cm, time.Now())
		if err := r.put(ctx, rec); err != nil {
			r.Metrics.incRecordError("write")
			if !failing {
				r.Log.WithError(err).Error("trust record not written; retrying")
			}
			failing = true
			retry.Reset(2 * time.Second)
			continue
		}
		if failing {
			r.Log.Info("trust record written again")
			failing = false
		}
		recorded, recordedCM = s, cm
		r.Log.WithField("trusted", rec.Trusted).WithField("signing", rec.Signing).WithField("controller_manager_signing", cm).
			Info("trust record written: the apiserver fetched a new key set, or the controller-manager's key changed")
		if r.Written != nil {
			r.Written(rec)
		}
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
		r.Metrics.incRecordError("controller_manager_key")
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

// put writes rec through the trust package, as kube-apiserver-safe-restart
// does, without a lock condition: the signer holds no restart lock.
func (r *Recorder) put(ctx context.Context, rec trust.Record) error {
	cli, err := r.Client(ctx)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	return trust.Put(pctx, cli, r.Prefix, "", rec)
}

// Barrier answers whether every recorded host's apiserver trusts a key.
type Barrier struct {
	Client  ClientFunc
	Prefix  string // trust prefix, with its trailing slash
	Timeout time.Duration
	Log     logrus.FieldLogger
}

// NotTrustedError names the hosts that did not trust the key in time.
type NotTrustedError struct {
	KeyID string
	Hosts []string
	After time.Duration
}

func (e *NotTrustedError) Error() string {
	return fmt.Sprintf("key %s not trusted by %s within %s", e.KeyID, strings.Join(e.Hosts, ", "), e.After)
}

// Missing returns the hosts whose record (under prefix) does not list kid.
// A record that does not parse trusts nothing.
func Missing(kvs map[string][]byte, kid string) []string {
	var out []string
	for host, v := range kvs {
		var r trust.Record
		if err := json.Unmarshal(v, &r); err != nil || !slices.Contains(r.Trusted, kid) {
			out = append(out, host)
		}
	}
	sort.Strings(out)
	return out
}

// Wait returns nil once every host with a trust record lists kid, and a
// *NotTrustedError after b.Timeout. It reads the records, then waits for
// the next change to them (one watch), and reads again.
func (b *Barrier) Wait(ctx context.Context, kid string) error {
	tctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	var missing []string
	logged := ""
	for {
		cli, err := b.Client(tctx)
		var resp *clientv3.GetResponse
		if err == nil {
			resp, err = cli.Get(tctx, b.Prefix, clientv3.WithPrefix())
		}
		if err != nil {
			if tctx.Err() != nil {
				break
			}
			b.Log.WithError(err).Warn("trust barrier: records unreadable; retrying")
			select {
			case <-tctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		kvs := map[string][]byte{}
		for _, kv := range resp.Kvs {
			if h, ok := strings.CutPrefix(string(kv.Key), b.Prefix); ok && h != "" && !strings.Contains(h, "/") {
				kvs[h] = kv.Value
			}
		}
		missing = Missing(kvs, kid)
		if len(missing) == 0 {
			return nil
		}
		if m := strings.Join(missing, ", "); m != logged {
			logged = m
			b.Log.WithField("kid", kid).WithField("hosts", missing).Info("trust barrier: waiting for these hosts' apiservers to fetch the key")
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(tctx))
		wch := cli.Watch(wctx, b.Prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		select {
		case <-wch:
		case <-tctx.Done():
		}
		wcancel()
		if tctx.Err() != nil {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return &NotTrustedError{KeyID: kid, Hosts: missing, After: b.Timeout}
}

// IsNotTrusted reports a barrier timeout.
func IsNotTrusted(err error) bool {
	var e *NotTrustedError
	return errors.As(err, &e)
}
