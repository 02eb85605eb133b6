package backends

import (
	"context"
	"fmt"
	"strings"

	"github.com/keysync/confd/backends/env"
	"github.com/keysync/confd/backends/etcdv3"
	"github.com/keysync/confd/backends/file"
)

// Defaults applied by New to zero durations.
const (
	DefaultDialTimeout    = etcdv3.DefaultDialTimeout    // 5s
	DefaultRequestTimeout = etcdv3.DefaultRequestTimeout // 10s
)

// names are the backends New accepts, in the order help text lists them,
// and whether each can be watched (the others are polled with -interval).
var names = []struct {
	name  string
	watch bool
}{{"etcdv3", true}, {"etcd", true}, {"env", false}, {"file", false}}

// Names lists the backends New accepts.
func Names() []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n.name
	}
	return out
}

// Supported reports whether New accepts name.
func Supported(name string) bool { _, ok := lookup(name); return ok }

// CanWatch reports whether backend name can serve -watch.
func CanWatch(name string) bool { n, ok := lookup(name); return ok && n.watch }

func lookup(name string) (struct {
	name  string
	watch bool
}, bool) {
	for _, n := range names {
		if n.name == name {
			return n, true
		}
	}
	return names[0], false
}

// ErrCompacted is wrapped by Watch when the store no longer has the
// revisions after afterRev: the caller must read everything again and watch
// from the new revision. Test with errors.Is.
var ErrCompacted = etcdv3.ErrCompacted

var (
	_ StoreClient = (*etcdv3.Client)(nil)
	_ StoreClient = (*env.Client)(nil)
	_ StoreClient = (*file.Client)(nil)
)

// New returns the store cfg.Backend names, connected: for etcd, New fails
// (within about cfg.DialTimeout) when no endpoint answers, instead of the
// first read failing later.
func New(ctx context.Context, cfg Config) (StoreClient, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	switch cfg.Backend {
	case "etcdv3", "etcd", "":
		// "etcd" meant the v2 API in confd; etcd on Kubernetes masters
		// serves v3 only, so the name is kept as an alias. It was also
		// confd's default.
		name := cfg.Backend
		if name == "" {
			name = "etcd"
		}
		c, err := etcdv3.New(ctx, etcdv3.Config{
			Backend:        name,
			Nodes:          cfg.Nodes,
			Scheme:         cfg.Scheme,
			SRVDomain:      cfg.SRVDomain,
			SRVRecord:      cfg.SRVRecord,
			ClientCAKeys:   cfg.ClientCAKeys,
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
	return nil, fmt.Errorf("backend %q is not supported; use one of %s", cfg.Backend, strings.Join(Names(), ", "))
}
