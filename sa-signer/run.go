package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdclient"
	"github.com/keysync/confd/internal/logfmt"
	"github.com/keysync/confd/signer"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// run is main without the process: ctx ends at SIGTERM or SIGINT; hup
// delivers SIGHUP (re-read the signing key).
func run(ctx context.Context, args []string, env lookupEnv, hup <-chan os.Signal, stdout, stderr io.Writer) int {
	o, fs, err := parseArgs(args, env)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", progName, err, progName)
		return exitUsage
	}
	if o.help {
		writeHelp(stdout, fs)
		return exitOK
	}
	if o.version {
		fmt.Fprintf(stdout, "%s %s\n", progName, Version)
		return exitOK
	}
	log, err := logfmt.New(stderr, o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", progName, err)
		return exitUsage
	}
	if err := serve(ctx, o, log, hup); err != nil {
		log.WithError(err).Error("stopped")
		return exitError
	}
	return exitOK
}

func serve(ctx context.Context, o *options, log *logrus.Logger, hup <-chan os.Signal) error {
	key, err := signer.LoadSigningKey(o.signingKey)
	if err != nil {
		return err
	}
	m := signer.NewMetrics()
	ks := signer.NewKeySet(nil, key)
	switch c, err := signer.ReadCache(o.cacheFile); {
	case err != nil:
		// A damaged cache is not a reason to stay down: etcd is the source;
		// the cache is only a fallback for when it is unreachable.
		log.WithError(err).Warn("key cache unusable: starting without it")
	case c != nil:
		ks.Restore(c.Hosts, c.IDs, c.Time)
		log.WithField("keys", len(ks.Snapshot().Keys)).WithField("since", c.Time.Format(time.RFC3339)).Info("key set restored from the cache")
	}
	cw := &cacheWriter{path: o.cacheFile, keys: ks, log: log, metrics: m}
	ks.OnChange(func(s *signer.Snapshot) {
		m.SetSnapshot(s)
		log.WithField("kids", s.IDs()).WithField("signing", s.Signing).Info("key set changed")
		cw.write()
	})
	m.SetSnapshot(ks.Snapshot())
	log.WithField("kid", key.KeyID).WithField("alg", key.Alg).WithField("file", key.Path).Info("signing key loaded")

	lis, err := signer.Listen(ctx, o.socket, o.gid)
	if err != nil {
		return err
	}
	svc := &signer.Service{Keys: ks, RefreshHint: o.refreshHint, MaxTokenExpiration: o.maxTokenExpiration, Log: log, Metrics: m}
	g := signer.NewGRPCServer(svc)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Go(func() {
		if err := g.Serve(lis); err != nil {
			errc <- fmt.Errorf("socket %s: %w", o.socket, err)
		}
	})
	f := &signer.Follower{
		Connect:        func(ctx context.Context) (*clientv3.Client, error) { return etcdClient(ctx, o) },
		Prefix:         signer.NormalizePrefix(o.keysPrefix),
		Keys:           ks,
		Log:            log,
		RequestTimeout: o.commandTimeout,
		Metrics:        m,
	}
	wg.Go(func() {
		_ = f.Run(ctx, func() {
			log.WithField("keys", len(ks.Snapshot().Keys)).WithField("prefix", f.Prefix).Info("published keys read from etcd; watching")
			// The first read may leave the set as restored: the cache is
			// still written once, so that it exists after a first start.
			cw.write()
		})
	})
	if o.metricsAddr != "" {
		srv, err := metricsServer(ctx, o.metricsAddr, m)
		if err != nil {
			cancel()
			g.Stop()
			wg.Wait()
			return err
		}
		defer srv.Close()
	}
	log.WithField("socket", o.socket).Info("serving ExternalJWTSigner")
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.WithError(err).Warn("systemd notification failed")
	}

	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errc:
			runErr = err
			break loop
		case <-hup:
			reloadSigningKey(o, ks, log)
		}
	}
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	cancel()
	stopGRPC(g, 5*time.Second)
	wg.Wait()
	return runErr
}

// reloadSigningKey re-reads --signing-key; a file that fails to load
// leaves the current key signing.
func reloadSigningKey(o *options, ks *signer.KeySet, log logrus.FieldLogger) {
	k, err := signer.LoadSigningKey(o.signingKey)
	if err != nil {
		log.WithError(err).Error("SIGHUP: signing key not reloaded; still signing with the current key")
		return
	}
	if cur := ks.Signer(); cur.KeyID == k.KeyID {
		log.WithField("kid", k.KeyID).Info("SIGHUP: signing key unchanged")
		return
	}
	ks.SetSigning(k)
	log.WithField("kid", k.KeyID).Info("SIGHUP: signing with the new key")
}

// stopGRPC lets calls in flight finish, for at most d.
func stopGRPC(g interface {
	GracefulStop()
	Stop()
}, d time.Duration) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		g.Stop()
		<-done
	}
}

func etcdClient(ctx context.Context, o *options) (*clientv3.Client, error) {
	return etcdclient.New(ctx, etcdclient.Config{
		Nodes: o.endpoints, ClientCAKeys: o.cacert, ClientCert: o.cert, ClientKey: o.key,
		Username: o.user, Password: o.password, DialTimeout: o.dialTimeout, RequestTimeout: o.commandTimeout,
	})
}

// cacheWriter writes the cache file, one write at a time, always of the
// set served at the moment of the write (so writes racing each other still
// leave the newest set on disk).
type cacheWriter struct {
	mu      sync.Mutex
	path    string
	keys    *signer.KeySet
	log     logrus.FieldLogger
	metrics *signer.Metrics
	failing bool
}

func (w *cacheWriter) write() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.keys.Cache().Write(w.path); err != nil {
		w.metrics.IncCacheFailure()
		if !w.failing {
			w.failing = true
			w.log.WithError(err).Error("key cache not written: a start while etcd is unreachable would serve an older set")
		}
		return
	}
	if w.failing {
		w.failing = false
		w.log.WithField("file", w.path).Info("key cache written again")
	}
}

func metricsServer(ctx context.Context, addr string, m *signer.Metrics) (*http.Server, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // closed with the process
		}
	}()
	return srv, nil
}
