package sasigner

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/fqdn"
	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/internal/promserve"
	"github.com/keysync/confd/sasigner/signer"
)

func serve(ctx context.Context, o *options, log *logrus.Logger, hup <-chan os.Signal) error {
	m := signer.NewMetrics()
	km := &signer.KeyManager{Log: log, Metrics: m, File: o.signingKey}
	key, err := km.Load()
	if err != nil {
		return err
	}
	host := o.host
	if host == "" {
		h, _ := os.Hostname()
		host = fqdn.Lookup(ctx, log, h)
	}
	if err := etcdkey.ValidHost(host); err != nil {
		return fmt.Errorf("--host: %w", err)
	}
	cache, err := signer.ReadCache(o.cacheFile)
	if err != nil {
		// A damaged cache is not a reason to stay down: etcd is the source;
		// the cache is only a fallback for when it is unreachable.
		log.WithError(err).Warn("key cache unusable: starting without it")
	}
	// The key that signed before this start passed the barrier then; any
	// other key (a new master, or a key file changed while the signer was
	// down) waits for it, with no previous key to sign with meanwhile.
	trusted := o.trustTimeout == 0 || (cache != nil && cache.Signing == key.KeyID)
	ks := signer.NewKeySet(nil, key)
	if !trusted {
		ks = signer.NewKeySet(nil, nil, key)
	}
	if cache != nil {
		ks.Restore(cache.Hosts, cache.IDs, cache.Time)
		log.WithField("keys", len(ks.Snapshot().Keys)).WithField("since", cache.Time.Format(time.RFC3339)).Info("key set restored from the cache")
	}
	cw := &signer.ChangeWriter{Keys: ks, CacheFile: o.cacheFile, Quiet: time.Second, Log: log, Metrics: m}
	ks.OnDiff = cw.Changed
	defer cw.Close()
	snap := ks.Snapshot()
	m.SetKeys(len(snap.Keys), snap.Time)
	log.WithField("kid", key.KeyID).WithField("alg", key.Alg).WithField("file", o.signingKey).WithField("host", host).Info("signing key loaded")

	lis, err := signer.Listen(ctx, o.socket, o.gid)
	if err != nil {
		return err
	}
	if o.metricsAddr != "" {
		srv, err := promserve.Serve(ctx, "--metrics-addr", o.metricsAddr, m.Registry)
		if err != nil {
			_ = lis.Close()
			return err
		}
		defer srv.Close()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	etcd := &clients{o: o}
	rec := &signer.Recorder{Client: etcd.get, Prefix: etcdkey.Dir(o.trustPrefix), Host: host, Timeout: o.CommandTimeout, Log: log, Metrics: m}
	if files := o.cmFlagsFiles; len(files) > 0 {
		rec.ControllerManager = func() (string, error) {
			_, kid, err := preflight.ControllerManagerKey(files)
			return kid, err
		}
	}
	svc := &signer.Service{Keys: ks, RefreshHint: o.refreshHint, MaxTokenExpiration: o.maxTokenExpiration, Log: log, Metrics: m, Fetched: rec.Fetched}
	g := signer.NewGRPCServer(svc)
	km.Keys = ks
	if o.trustTimeout > 0 {
		km.Barrier = &signer.Barrier{Client: etcd.get, Prefix: etcdkey.Dir(o.trustPrefix), Timeout: o.trustTimeout, Log: log}
	}

	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Go(func() {
		if err := g.Serve(lis); err != nil {
			errc <- fmt.Errorf("socket %s: %w", o.socket, err)
		}
	})
	wg.Go(func() { rec.Run(ctx) })
	f := &signer.Follower{
		Connect:        etcd.get,
		Prefix:         etcdkey.Dir(o.keysPrefix),
		Keys:           ks,
		Log:            log,
		RequestTimeout: o.CommandTimeout,
		Metrics:        m,
	}
	wg.Go(func() {
		f.Run(ctx, func() {
			log.WithField("keys", len(ks.Snapshot().Keys)).WithField("prefix", f.Prefix).Info("published keys read from etcd; watching")
			// The first read may leave the set as restored: the cache is
			// still written once, so that it exists after a first start.
			cw.Flush()
		})
	})
	if !trusted {
		log.WithField("kid", key.KeyID).Warn("signing key not known to have passed the trust barrier: no token is signed until every recorded host's apiserver fetched it")
		km.Promote(ctx, nil, key, true)
	}
	log.WithField("socket", o.socket).Info("serving ExternalJWTSigner")
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.WithError(err).Warn("systemd notification failed")
	}

	// changed notices a replaced or rewritten key file (rotate-key renames
	// a new key over the old one).
	var last os.FileInfo
	changed := func() bool {
		fi, err := os.Stat(o.signingKey)
		if err != nil {
			return false // a missing file is not a new key; the next one is
		}
		prev := last
		last = fi
		return prev == nil || !os.SameFile(prev, fi) || !prev.ModTime().Equal(fi.ModTime()) || prev.Size() != fi.Size()
	}
	changed() // the file as it is at start
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var runErr error // only errors are sent on errc
	for runErr == nil && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case runErr = <-errc:
		case <-hup:
			changed() // the reload reads the file as it is now
			km.Reload(ctx, "SIGHUP")
		case <-tick.C:
			if changed() {
				km.Reload(ctx, "file change")
			}
		}
	}
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	cancel()
	// Calls in flight may finish, for at most 5 s: Stop ends GracefulStop.
	force := time.AfterFunc(5*time.Second, g.Stop)
	g.GracefulStop()
	force.Stop()
	km.Wait()
	wg.Wait()
	if etcd.cli != nil { // every user of the connection has ended
		_ = etcd.cli.Close()
	}
	return runErr
}

// clients connects to etcd once, for every user of the connection.
type clients struct {
	mu  sync.Mutex
	o   *options
	cli *clientv3.Client
}

func (c *clients) get(ctx context.Context) (*clientv3.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	if c.cli == nil {
		c.cli, err = c.o.Client(ctx) // nil on error: the next call tries again
	}
	return c.cli, err
}
