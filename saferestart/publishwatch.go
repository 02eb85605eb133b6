package saferestart

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/keystate"

	"github.com/keysync/confd/internal/promserve"
	"github.com/keysync/confd/internal/sdnotify"
	"github.com/keysync/confd/internal/version"
	"github.com/keysync/confd/saferestart/internal/keywatch"
)

const (
	// DefaultReconcileInterval bounds how long etcd may lack what a
	// master keeps published (issue 31: within 30 s).
	DefaultReconcileInterval = 30 * time.Second
	MaxReconcileInterval     = 30 * time.Second
	DefaultStateDir          = "/var/lib/kube-apiserver-safe-restart"
	KeywatchTombstones       = keywatch.TombstonesFile
	// keyFilePoll: how often --watch reads the key files for a change.
	keyFilePoll = 2 * time.Second
)

func (o *PublishWatchFlags) Validate() []error {
	var errs []error
	if o.ReconcileInterval <= 0 || o.ReconcileInterval > MaxReconcileInterval {
		errs = append(errs, Usagef("--reconcile-interval %s: must be positive and at most %s", o.ReconcileInterval, MaxReconcileInterval))
	}
	// Without --watch the publisher's settings are ignored, not refused:
	// the one file that sets them serves the one-shot publish-key too.
	return errs
}

// publishWatch is `publish-key --watch`: the long-running publisher of
// sa-key-publish.service. It keeps running through etcd outages; exit 3
// when the key files are refused at start (nothing written), 1 when the
// metrics address cannot be served.
func (o *publishKeyCmd) publishWatch(ctx context.Context, a *Env, cli *clientv3.Client) int {
	host := a.TrustHost(ctx)
	store := KeyStore(cli, o.KeysPrefix, o.RotationPrefix)
	log := a.Log.WithField("host", host)
	m := keywatch.NewMetrics()
	if o.PublisherMetricsAddr != "" {
		srv, err := promserve.Serve(ctx, "--publisher-metrics-addr", o.PublisherMetricsAddr, m.Registry)
		if err != nil {
			log.WithError(err).Error("publish-key --watch: cannot serve metrics; choose another address")
			return ExitError
		}
		defer srv.Close()
	}
	files := []string{o.SigningKey}
	switch {
	case o.Certificate != "":
		files = []string{o.Certificate}
	case o.PublicKey != "":
		files = []string{o.PublicKey}
	}
	w := &keywatch.Watcher{
		Client: cli,
		Store:  store,
		Host:   host,
		Source: o.publishSource,
		Files:  files,
		Trim: func(rec keystate.Record, log logrus.FieldLogger) {
			TrimOwnFiles(rec, o.SigningKey, o.PublicKey, o.Certificate, log)
		},
		Grace:          o.Grace,
		By:             cmdPublishKey,
		Interval:       o.ReconcileInterval,
		Poll:           min(keyFilePoll, o.ReconcileInterval),
		TTL:            o.TTL,
		RequestTimeout: a.Etcd.CommandTimeout,
		StateDir:       o.StateDir,
		Version:        version.Version,
		Log:            log,
		Metrics:        m,
		Notify:         sdnotify.New(os.Getenv, log),
	}
	// The stale-token sampler lives as long as the publisher: one per
	// master, reading its own apiserver (--apiserver-metrics-url).
	if s := o.staleTokenSampler(ctx, a, cli); s != nil {
		s.Failed = m.SampleFailed
		w.Runners = append(w.Runners, s.Run)
	}
	log.WithFields(map[string]any{"files": files, "interval": o.ReconcileInterval.String(), "state-dir": o.StateDir}).Info("publish-key --watch: keeping this host's keys published")
	err := w.Run(ctx)
	var refused *keywatch.Refused
	if errors.As(err, &refused) {
		log.Error("publish-key --watch: refusing to publish; nothing written (fix the key files; systemd starts it again)")
		return ExitPreflight
	}
	if err != nil {
		log.WithError(err).Error("publish-key --watch stopped")
		return ExitError
	}
	log.Info("publish-key --watch: stopped; alive record removed")
	return ExitOK
}
