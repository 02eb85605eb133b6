package keycmd

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
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/internal/version"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/fleetstate"
	"github.com/keysync/confd/saferestart/internal/keywatch"
	"github.com/keysync/confd/saferestart/internal/tokenprobe"
)

// keyFilePoll: how often --watch reads the key files for a change.
const keyFilePoll = 2 * time.Second

// publishWatch is `publish-key --watch`: the long-running publisher of
// sa-key-publish.service. It keeps running through etcd outages; exit 3
// when the key files are refused at start (nothing written), 1 when the
// metrics address cannot be served.
func (o *PublishKey) publishWatch(ctx context.Context, a *cmdkit.Env, cli *clientv3.Client) int {
	host := a.TrustHost(ctx)
	store := cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix)
	log := a.Log.WithField("host", host)
	m := keywatch.NewMetrics()
	m.Registry.MustRegister(&fleetstate.Collector{Log: log, Failed: m.FleetStateFailed,
		Read: func(ctx context.Context) (*fleetstate.Snapshot, error) {
			return fleetstate.Read(ctx, cli, trust.Prefixes{Keys: o.KeysPrefix, Trust: o.TrustPrefix, Rotation: o.RotationPrefix},
				o.LockName, o.HoldKeyOrDefault())
		}})
	if o.PublisherMetricsAddr != "" {
		srv, err := promserve.Serve(ctx, "--publisher-metrics-addr", o.PublisherMetricsAddr, m.Registry)
		if err != nil {
			log.WithError(err).Error("publish-key --watch: cannot serve metrics; choose another address")
			return cmdkit.ExitError
		}
		defer srv.Close()
	}
	files := []string{o.sourceFile()}
	w := &keywatch.Watcher{
		Client: cli,
		Store:  store,
		Host:   host,
		Source: o.publishSource,
		Files:  files,
		Trim: func(rec keystate.Record, log logrus.FieldLogger) {
			cmdkit.TrimOwnFiles(rec, o.SigningKey, o.PublicKey, o.Certificate, log)
		},
		Grace:          o.Grace,
		By:             byPublishKey,
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
	if s := o.StaleTokenSampler(ctx, a, cli); s != nil {
		s.Failed = m.SampleFailed
		w.Runners = append(w.Runners, s.Run)
	}
	if r := tokenProbe(&o.TokenProbe, host, log, m); r != nil {
		w.Runners = append(w.Runners, r)
	}
	log.WithFields(map[string]any{"files": files, "interval": o.ReconcileInterval.String(), "state-dir": o.StateDir}).Info("publish-key --watch: keeping this host's keys published")
	err := w.Run(ctx)
	var refused *keywatch.Refused
	if errors.As(err, &refused) {
		log.Error("publish-key --watch: refusing to publish; nothing written (fix the key files; systemd starts it again)")
		return cmdkit.ExitPreflight
	}
	if err != nil {
		log.WithError(err).Error("publish-key --watch stopped")
		return cmdkit.ExitError
	}
	log.Info("publish-key --watch: stopped; alive record removed")
	return cmdkit.ExitOK
}

// tokenProbe is the cross-acceptance probe's runner, its metrics in the
// publisher's registry, when --token-probe-kubeconfig is set (nil
// otherwise). An unusable kubeconfig is logged and the publisher runs
// without the probe: publishing the keys matters more than measuring them.
func tokenProbe(o *cmdkit.TokenProbe, host string, log logrus.FieldLogger, m *keywatch.Metrics) func(context.Context) error {
	if o.TokenProbeKubeconfig == "" {
		return nil
	}
	targets, _ := tokenprobe.ParseTargets(o.TokenProbeAPIServers) // validated
	log = log.WithField("probe", "token")
	pr, err := tokenprobe.New(tokenprobe.Config{Host: host, Kubeconfig: o.TokenProbeKubeconfig, ServiceAccount: o.TokenProbeServiceAccount,
		Targets: targets, Interval: o.TokenProbeInterval, Timeout: min(tokenprobe.DefaultTimeout, o.TokenProbeInterval), Log: log})
	if err == nil {
		err = pr.Register(m.Registry)
	}
	if err != nil {
		log.WithError(err).Error("token probe not started; fix --token-probe-kubeconfig and restart the publisher")
		return nil
	}
	return pr.Run
}
