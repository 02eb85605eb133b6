package signer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// KeyManager switches the signing key: a new key is served at once (so
// this host's apiserver fetches it) but signs only once every recorded
// host's apiserver has fetched it (the trust barrier); until then, or if
// the barrier times out, the previous key signs. When the file holds the
// signing key again during the wait (rotate-key --rollback), the switch is
// cancelled: it would sign with a key the file no longer holds.
type KeyManager struct {
	Keys *KeySet
	// Barrier is nil to switch at once (--trust-timeout 0).
	Barrier *Barrier
	Log     logrus.FieldLogger
	Metrics *Metrics
	// File is the signing key file (--signing-key).
	File string

	mu sync.Mutex
	// pending is the key waiting for the barrier (nil: none), cancel ends
	// its wait, gen tells a superseded or cancelled wait.
	pending *SigningKey
	cancel  context.CancelFunc
	gen     uint64
	wg      sync.WaitGroup
}

// Load reads File (LoadSigningKey) and warns, logged and counted, at every
// load until fixed, when others than this process's user may read or
// replace it (permission bits for group or others, or another owner):
// anyone who can read it can sign tokens every apiserver of the fleet
// accepts. The file is stat'ed following links, as the key is read; one
// that cannot be stat'ed warns of nothing.
func (m *KeyManager) Load() (*SigningKey, error) {
	k, err := LoadSigningKey(m.File)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(m.File)
	if err != nil {
		return k, nil
	}
	warn := func(reason, text string) {
		m.Metrics.keyFile.WithLabelValues(reason).Inc()
		m.Log.WithField("file", fmt.Sprintf("%q", m.File)).WithField("kid", k.KeyID).Warn("signing key file: " + text)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		warn("mode", fmt.Sprintf("mode %04o: group or others may read it (want 0600 or 0400)", perm))
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		warn("owner", fmt.Sprintf("owned by uid %d, not by this process's uid %d: that user can replace the signing key", st.Uid, os.Geteuid()))
	}
	return k, nil
}

// Reload re-reads File; a file that fails to load leaves the current key
// signing. ctx bounds a barrier wait it starts.
func (m *KeyManager) Reload(ctx context.Context, why string) {
	k, err := m.Load()
	if err != nil {
		m.Log.WithError(err).Errorf("%s: signing key not reloaded; still signing with the current key", why)
		return
	}
	m.mu.Lock()
	cur := m.Keys.Signer()
	if cur != nil && cur.KeyID == k.KeyID {
		if p := m.pending; p != nil {
			m.stopLocked()
			// The pending key never signed: nothing needs it served.
			m.Keys.SetSigning(cur)
			m.mu.Unlock()
			m.Log.WithField("kid", cur.KeyID).WithField("cancelled", p.KeyID).
				Warnf("%s: the key file holds the signing key again: switch to %s cancelled before it signed; still signing with %s", why, p.KeyID, cur.KeyID)
			return
		}
		m.mu.Unlock()
		m.Log.WithField("kid", k.KeyID).Infof("%s: signing key unchanged", why)
		return
	}
	if m.Barrier == nil {
		m.stopLocked()
		m.Keys.SetSigning(k)
		m.mu.Unlock()
		m.Log.WithField("kid", k.KeyID).Infof("%s: signing with the new key", why)
		return
	}
	m.mu.Unlock()
	m.Log.WithField("kid", k.KeyID).Infof("%s: new signing key served; it signs once every recorded host's apiserver fetched it", why)
	m.Promote(ctx, cur, k, false)
}

// stopLocked cancels the wait in progress, if any. Called with mu held.
func (m *KeyManager) stopLocked() {
	if m.cancel != nil {
		m.cancel()
	}
	m.pending, m.cancel = nil, nil
	m.gen++
}

// Promote serves next beside prev (prev keeps signing; nil: none signs)
// and waits, in the background, for the barrier; newHost says next is
// this host's first key. A later Promote, or a Reload that finds the file
// holding prev again, cancels the wait.
func (m *KeyManager) Promote(ctx context.Context, prev, next *SigningKey, newHost bool) {
	m.mu.Lock()
	m.stopLocked()
	wctx, cancel := context.WithCancel(ctx)
	m.pending, m.cancel = next, cancel
	gen := m.gen
	m.Keys.SetSigning(prev, next)
	m.mu.Unlock()
	m.wg.Go(func() {
		defer cancel()
		start := time.Now()
		err := m.Barrier.Wait(wctx, next.KeyID)
		l := m.Log.WithField("kid", next.KeyID).WithField("waited", time.Since(start).Round(time.Millisecond).String())
		m.mu.Lock()
		defer m.mu.Unlock()
		// Checked under mu: a Reload cancelling this wait as the barrier
		// passed must not be undone by the switch below.
		if gen != m.gen {
			return // superseded or cancelled
		}
		m.pending, m.cancel = nil, nil
		switch {
		case err == nil && newHost:
			m.Keys.SetSigning(next)
			l.Info("every recorded host's apiserver fetched this host's key: signing")
		case err == nil:
			m.Keys.SetSigning(next)
			l.Info("every recorded host's apiserver fetched the new key: signing with it")
		case wctx.Err() != nil:
			// Stopping.
		case prev == nil && newHost:
			// A new master has no previous key: signing nothing forever
			// because a recorded host is gone would take it out of service.
			m.Keys.SetSigning(next)
			l.WithError(err).Error("trust barrier timed out for this host's first key: signing with it anyway; the hosts named may refuse its tokens")
		case errors.Is(err, context.Canceled):
		default:
			l.WithError(err).Error("trust barrier timed out: still signing with the previous key (send SIGHUP to try again)")
		}
	})
}

// Wait cancels the wait in progress and returns once it has ended.
func (m *KeyManager) Wait() {
	m.mu.Lock()
	m.stopLocked()
	m.mu.Unlock()
	m.wg.Wait()
}
