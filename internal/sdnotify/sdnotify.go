// Package sdnotify tells systemd (Type=notify) when a long-running
// process (confd -watch, publish-key --watch) is ready, keeps its watchdog
// fed, and says when it is stopping. It does nothing when NOTIFY_SOCKET is
// unset.
package sdnotify

import (
	"context"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
)

// Notifier reports readiness to systemd (Ready: daemon.Observer's).
type Notifier struct {
	log      logrus.FieldLogger
	watchdog time.Duration
	once     sync.Once
}

// New returns nil when confd was not started by systemd with
// Type=notify (no NOTIFY_SOCKET).
func New(getenv func(string) string, log logrus.FieldLogger) *Notifier {
	if getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	d, err := daemon.SdWatchdogEnabled(false) // 0 on an error
	if err != nil {
		log.Warnf("systemd watchdog settings unreadable: %v", err)
	}
	return &Notifier{log: log, watchdog: d}
}

func (n *Notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warnf("sd_notify %q: %v", state, err)
	}
}

// Ready sends READY=1 the first time confd is ready (every resource
// rendered, the watch live), and a STATUS line on every change.
func (n *Notifier) Ready(ready bool) {
	if !ready {
		n.send("STATUS=not ready: a resource failed to render or the etcd watch is down")
		return
	}
	n.ReadyStatus("ready: every resource rendered, watch live")
}

// Watchdog feeds systemd's watchdog (WatchdogSec=) at half its interval
// until ctx ends.
func (n *Notifier) Watchdog(ctx context.Context) {
	if n.watchdog <= 0 {
		return
	}
	t := time.NewTicker(n.watchdog / 2)
	defer t.Stop()
	for {
		n.send(daemon.SdNotifyWatchdog)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stopping tells systemd that confd is shutting down.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// ReadyStatus sends READY=1 the first time, and status as the unit's
// STATUS line every time (a process other than confd says what it does).
// A nil Notifier (no systemd) does nothing.
func (n *Notifier) ReadyStatus(status string) {
	if n == nil {
		return
	}
	n.once.Do(func() { n.send(daemon.SdNotifyReady) })
	n.send("STATUS=" + status)
}

// Ping feeds systemd's watchdog once, when WatchdogSec= is set: a loop
// that pings from its own iterations proves it still turns, which a
// ticker of its own (Watchdog) does not.
func (n *Notifier) Ping() {
	if n != nil && n.watchdog > 0 {
		n.send(daemon.SdNotifyWatchdog)
	}
}
