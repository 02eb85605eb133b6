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
	// defaultReconcileInterval bounds how long etcd may lack what a
	// master keeps published (issue 31: within 30 s).
	defaultReconcileInterval = 30 * time.Second
	maxReconcileInterval     = 30 * time.Second
	defaultStateDir          = "/var/lib/kube-apiserver-safe-restart"
	keywatchTombstones       = keywatch.TombstonesFile
	// keyFilePoll: how often --watch reads the key files for a change.
	keyFilePoll = 2 * time.Second
)

func (o *publishWatchOpts) validate() []error {
	var errs []error
	if o.reconcileInterval <= 0 || o.reconcileInterval > maxReconcileInterval {
		errs = append(errs, usagef("--reconcile-interval %s: must be positive and at most %s", o.reconcileInterval, maxReconcileInterval))
	}
	// Without --watch the publisher's settings are ignored, not refused:
	// the one file that sets them serves the one-shot publish-key too.
	return errs
}

// publishWatch is `publish-key --watch`: the long-running publisher of
// sa-key-publish.service. It keeps running through etcd outages; exit 3
// when the key files are refused at start (nothing written), 1 when the
// metrics address cannot be served.
func (o *publishKeyCmd) publishWatch(ctx context.Context, a *cmdEnv, cli *clientv3.Client) int {
	host := a.trustHost(ctx)
	store := keyStore(cli, o.keysPrefix, o.rotationPrefix)
	log := a.log.WithField("host", host)
	m := keywatch.NewMetrics()
	if o.publisherMetricsAddr != "" {
		srv, err := promserve.Serve(ctx, "--publisher-metrics-addr", o.publisherMetricsAddr, m.Registry)
		if err != nil {
			log.WithError(err).Error("publish-key --watch: cannot serve metrics; choose another address")
			return exitError
		}
		defer srv.Close()
	}
	files := []string{o.signingKey}
	switch {
	case o.certificate != "":
		files = []string{o.certificate}
	case o.publicKey != "":
		files = []string{o.publicKey}
	}
	w := &keywatch.Watcher{
		Client: cli,
		Store:  store,
		Host:   host,
		Source: o.publishSource,
		Files:  files,
		Trim: func(rec keystate.Record, log logrus.FieldLogger) {
			trimOwnFiles(rec, o.signingKey, o.publicKey, o.certificate, log)
		},
		Grace:          o.grace,
		By:             cmdPublishKey,
		Interval:       o.reconcileInterval,
		Poll:           min(keyFilePoll, o.reconcileInterval),
		TTL:            o.ttl,
		RequestTimeout: a.etcd.CommandTimeout,
		StateDir:       o.stateDir,
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
	log.WithFields(map[string]any{"files": files, "interval": o.reconcileInterval.String(), "state-dir": o.stateDir}).Info("publish-key --watch: keeping this host's keys published")
	err := w.Run(ctx)
	var refused *keywatch.Refused
	if errors.As(err, &refused) {
		log.Error("publish-key --watch: refusing to publish; nothing written (fix the key files; systemd starts it again)")
		return exitPreflight
	}
	if err != nil {
		log.WithError(err).Error("publish-key --watch stopped")
		return exitError
	}
	log.Info("publish-key --watch: stopped; alive record removed")
	return exitOK
}
