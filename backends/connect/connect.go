// Package connect opens the store a backends.Config names. It is the one
// package that links every backend (and so etcd's client and gRPC): what
// only consumes stores (daemon, resource) imports backends, which links
// none of them.
package connect

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/backends/env"
	"github.com/keysync/confd/backends/etcdv3"
	"github.com/keysync/confd/backends/file"
	"github.com/keysync/confd/internal/etcdclient"
)

// Defaults of zero durations, as etcdclient.New, etcdv3.New and Watch
// apply them.
const (
	DefaultDialTimeout       = etcdclient.DefaultDialTimeout    // 5s
	DefaultRequestTimeout    = etcdclient.DefaultRequestTimeout // 10s
	DefaultWatchStallTimeout = etcdv3.DefaultStallTimeout       // 30s
)

// New returns the store cfg.Backend names, connected: for etcd, New fails
// (within about cfg.DialTimeout) when no endpoint answers, instead of the
// first read failing later.
func New(ctx context.Context, cfg backends.Config) (backends.StoreClient, error) {
	switch cfg.Backend {
	case "etcdv3", "etcd", "":
		// "etcd" meant the v2 API in confd; etcd on Kubernetes masters
		// serves v3 only, so the name is kept as an alias. It was also
		// confd's default.
		c, err := etcdv3.New(ctx, etcdv3.Config{
			Backend:      cmp.Or(cfg.Backend, "etcd"),
			Nodes:        cfg.Nodes,
			Scheme:       cfg.Scheme,
			SRVDomain:    cfg.SRVDomain,
			SRVRecord:    cfg.SRVRecord,
			ClientCAKeys: cfg.ClientCAKeys,
			// Only confd connects here: its flag (or confd.toml's key)
			// is the one to fix when etcd's certificate is not trusted.
			CAFlag:         "-client-ca-keys (client_cakeys in confd.toml, CONFD_CLIENT_CAKEYS)",
			ClientCert:     cfg.ClientCert,
			ClientKey:      cfg.ClientKey,
			ClientInsecure: cfg.ClientInsecure,
			// Sent whether or not BasicAuth is set: confd needed
			// -basic-auth too, and ignoring a given password helps no one.
			Username:       cfg.Username,
			Password:       cfg.Password,
			DialTimeout:    cfg.DialTimeout,
			RequestTimeout: cfg.RequestTimeout,
		})
		if err != nil {
			return nil, err
		}
		c.StallTimeout = cfg.WatchStallTimeout
		return c, nil
	case "env":
		return env.New(nil), nil
	case "file":
		c, err := file.New(cfg.YAMLFiles, cfg.Filter)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	return nil, fmt.Errorf("backend %q is not supported; use one of %s", cfg.Backend, strings.Join(backends.Names(), ", "))
}
