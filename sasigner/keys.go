package sasigner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/sasigner/signer"
)

// keyManager switches the signing key: a new key is served at once (so
// this host's apiserver fetches it) but signs only once every recorded
// host's apiserver has fetched it (the trust barrier); until then, and if
// that does not happen within --trust-timeout, the previous key signs.
type keyManager struct {
	ctx     context.Context
	ks      *signer.KeySet
	barrier *signer.Barrier // nil: switch at once (--trust-timeout 0)
	log     logrus.FieldLogger
	file    string

	mu     sync.Mutex
	cancel context.CancelFunc // of the wait in progress
	wg     sync.WaitGroup
}

// reload re-reads the key file; a file that fails to load leaves the
// current key signing.
func (m *keyManager) reload(why string) {
	k, err := signer.LoadSigningKey(m.file)
	if err != nil {
		m.log.WithError(err).Errorf("%s: signing key not reloaded; still signing with the current key", why)
		return
	}
	cur := m.ks.Signer()
	if cur != nil && cur.KeyID == k.KeyID {
		m.log.WithField("kid", k.KeyID).Infof("%s: signing key unchanged", why)
		return
	}
	if m.barrier == nil {
		m.ks.SetSigning(k)
		m.log.WithField("kid", k.KeyID).Infof("%s: signing with the new key", why)
		return
	}
	m.log.WithField("kid", k.KeyID).Infof("%s: new signing key served; it signs once every recorded host's apiserver fetched it", why)
	m.promote(cur, k, false)
}

// promote serves next beside prev (prev keeps signing) and waits, in the
// background, for the barrier. A later promote cancels an earlier wait.
func (m *keyManager) promote(prev, next *signer.SigningKey, newHost bool) {
	m.mu.Lock()
	if m.cancel != nil {
		m.cancel()
	}
	ctx, cancel := context.WithCancel(m.ctx)
	m.cancel = cancel
	m.mu.Unlock()
	m.ks.SetSigning(prev, next)
	m.wg.Go(func() {
		defer cancel()
		start := time.Now()
		err := m.barrier.Wait(ctx, next.KeyID)
		l := m.log.WithField("kid", next.KeyID).WithField("waited", time.Since(start).Round(time.Millisecond).String())
		switch {
		case err == nil && newHost:
			m.ks.SetSigning(next)
			l.Info("every recorded host's apiserver fetched this host's key: signing")
		case err == nil:
			m.ks.SetSigning(next)
			l.Info("every recorded host's apiserver fetched the new key: signing with it")
		case ctx.Err() != nil:
			// Superseded by a newer key, or stopping.
		case prev == nil && newHost:
			// A new master has no previous key: signing nothing forever
			// because a recorded host is gone would take it out of service.
			m.ks.SetSigning(next)
			l.WithError(err).Error("trust barrier timed out for this host's first key: signing with it anyway; the hosts named may refuse its tokens")
		case errors.Is(err, context.Canceled):
		default:
			l.WithError(err).Error("trust barrier timed out: still signing with the previous key (send SIGHUP to try again)")
		}
	})
}

func (m *keyManager) wait() {
	m.mu.Lock()
	if m.cancel != nil {
		m.cancel()
	}
	m.mu.Unlock()
	m.wg.Wait()
}
