package etcdclient

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/keysync/confd/internal/tlsconf"
)

// Config says how to reach etcd: endpoints (or SRV discovery), TLS files,
// credentials and timeouts. confd fills it from its flags (the field names
// are backends.Config's), kube-apiserver-safe-restart from etcdctl's.
type Config struct {
	// Backend is the name the backend was selected by ("etcdv3" or
	// "etcd"); confd named the SRV record looked up for SRVDomain after it.
	Backend string
	// Nodes are endpoints, as URLs or as host:port (scheme chosen as for
	// SRV nodes).
	Nodes []string
	// Scheme is "http" or "https" for nodes without one. https is used
	// anyway when TLS files or ClientInsecure are given.
	Scheme    string
	SRVDomain string
	SRVRecord string // full name, e.g. _etcd-client._tcp.example.com
	// ClientCAKeys is a PEM file of the CAs that sign the server
	// certificate; without it the system roots are used.
	ClientCAKeys string
	// CAFlag names the setting that gives ClientCAKeys in the caller's
	// own words (confd's -client-ca-keys, the helpers' --cacert): a
	// server certificate the CA does not verify is then reported with the
	// file in use and the setting to fix, not the bare x509 error. Empty
	// means "the CA file setting".
	CAFlag         string
	ClientCert     string
	ClientKey      string
	ClientInsecure bool // skip verification of the server certificate
	// Username and Password are sent whenever Username is set (confd sent
	// them only with -basic-auth).
	Username string
	Password string
	// DialTimeout bounds New: connecting, TLS, authentication and one read.
	DialTimeout time.Duration
	// RequestTimeout bounds one GetValues.
	RequestTimeout time.Duration
	// Resolver answers SRV queries; nil means net.DefaultResolver. Tests
	// answer without DNS.
	Resolver SRVResolver
}

// Defaults for zero durations, and the node confd used when none was given.
const (
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 10 * time.Second
	DefaultNode           = "127.0.0.1:2379"
)

// SRVResolver is the part of *net.Resolver used for SRV discovery.
type SRVResolver interface {
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// caSetting is CAFlag, or a neutral name for callers that set none.
func (cfg Config) caSetting() string { return cmp.Or(cfg.CAFlag, "the CA file setting") }

func (cfg Config) wantsTLS() bool {
	return cfg.ClientCAKeys != "" || cfg.ClientCert != "" || cfg.ClientKey != "" || cfg.ClientInsecure
}

// scheme is the scheme given to nodes that have none.
func (cfg Config) scheme() (string, error) {
	if cfg.Scheme != "" && cfg.Scheme != "http" && cfg.Scheme != "https" {
		return "", fmt.Errorf("scheme %q: want http or https", cfg.Scheme)
	}
	// confd's -scheme defaults to "http" even when certificates are given;
	// a client certificate is only ever meant for https.
	if cfg.Scheme == "https" || cfg.wantsTLS() {
		return "https", nil
	}
	return "http", nil
}

// endpoints returns the URLs to connect to: Nodes, else the nodes named by
// SRV records, else DefaultNode.
func endpoints(ctx context.Context, cfg Config) ([]string, error) {
	scheme, err := cfg.scheme()
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, n := range cfg.Nodes {
		if n = strings.TrimSpace(n); n != "" {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 && (cfg.SRVRecord != "" || cfg.SRVDomain != "") {
		if nodes, err = srvNodes(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if len(nodes) == 0 {
		nodes = []string{DefaultNode}
	}
	eps := make([]string, 0, len(nodes))
	for _, n := range nodes {
		ep, err := normalize(n, scheme)
		if err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	// clientv3 uses the first endpoint's transport for all of them, so a
	// mix would fail on some endpoints in ways hard to recognise.
	first := strings.SplitN(eps[0], "://", 2)[0]
	for _, ep := range eps[1:] {
		if s := strings.SplitN(ep, "://", 2)[0]; s != first {
			return nil, fmt.Errorf("endpoints %s mix %s and %s", strings.Join(eps, ", "), first, s)
		}
	}
	return eps, nil
}

// srvNodes looks up SRVRecord, else for SRVDomain confd's
// "_<backend>._tcp.<domain>", then etcd's own "_etcd-client._tcp.<domain>",
// through cfg.Resolver (the system's if nil): the nodes of the first that
// has records.
func srvNodes(ctx context.Context, cfg Config) ([]string, error) {
	names := []string{cfg.SRVRecord}
	if cfg.SRVRecord == "" {
		names = []string{"_" + cmp.Or(cfg.Backend, "etcdv3") + "._tcp." + cfg.SRVDomain}
		if cfg.Backend != "etcd-client" {
			names = append(names, "_etcd-client._tcp."+cfg.SRVDomain)
		}
	}
	var errs []error
	for _, name := range names {
		// With no service and proto, the name is looked up as given.
		_, addrs, err := cmp.Or[SRVResolver](cfg.Resolver, net.DefaultResolver).LookupSRV(ctx, "", "", name)
		if err == nil && len(addrs) == 0 {
			err = errors.New("no records")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("SRV %s: %w", name, err))
			continue
		}
		nodes := make([]string, 0, len(addrs))
		for _, a := range addrs {
			host := strings.TrimSuffix(a.Target, ".")
			nodes = append(nodes, net.JoinHostPort(host, strconv.Itoa(int(a.Port))))
		}
		return nodes, nil
	}
	return nil, fmt.Errorf("no etcd nodes from DNS: %w", errors.Join(errs...))
}

// normalize turns a node into a URL clientv3 accepts: host:port gets
// scheme, a URL keeps its own.
func normalize(node, scheme string) (string, error) {
	if !strings.Contains(node, "://") {
		node = scheme + "://" + node
	}
	u, err := url.Parse(node)
	if err != nil {
		return "", fmt.Errorf("node %q: %w", node, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("node %q: scheme %q, want http or https", node, u.Scheme)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "", fmt.Errorf("node %q: want scheme://host:port", node)
	}
	if u.Port() == "" {
		return "", fmt.Errorf("node %q: no port", node)
	}
	return u.Scheme + "://" + u.Host, nil
}

// tlsConfig returns nil for plain http endpoints without TLS settings.
func tlsConfig(cfg Config, eps []string) (*tls.Config, error) {
	if !cfg.wantsTLS() && !strings.HasPrefix(eps[0], "https://") {
		return nil, nil
	}
	switch {
	case cfg.ClientCert != "" && cfg.ClientKey == "":
		return nil, fmt.Errorf("client certificate %s given without its key (-client-key)", cfg.ClientCert)
	case cfg.ClientKey != "" && cfg.ClientCert == "":
		return nil, fmt.Errorf("client key %s given without its certificate (-client-cert)", cfg.ClientKey)
	}
	return clientTLS(cfg)
}

// clientTLS reads cfg's TLS files as they are now.
func clientTLS(cfg Config) (*tls.Config, error) {
	tc, err := tlsconf.Client(cfg.ClientCAKeys, cfg.ClientCert, cfg.ClientKey)
	if err != nil {
		return nil, err
	}
	tc.InsecureSkipVerify = cfg.ClientInsecure
	return tc, nil
}
