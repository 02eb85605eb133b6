package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// A helper whose CA does not sign etcd's certificate is told the CA file it
// used, or that it used the system roots, and the setting that gives it.
func TestClientNamesCASetting(t *testing.T) {
	s := etcdtest.Start(t, etcdtest.WithTLS())
	for _, tc := range []struct {
		e    Etcd
		want string
	}{
		{Etcd{}, "checked against the system roots, as no --cacert is given"},
		{Etcd{CACert: s.TLS.UntrustedClientCert, CAFrom: "ETCDCTL_CACERT"}, "checked against CA file " + s.TLS.UntrustedClientCert + ", given by ETCDCTL_CACERT"},
	} {
		e := tc.e
		e.Endpoints, e.Cert, e.Key, e.DialTimeout = []string{s.Endpoint}, s.TLS.ClientCert, s.TLS.ClientKey, 2*time.Second
		cli, err := e.Client(context.Background())
		if err == nil {
			_ = cli.Close()
			t.Fatal("connected")
		}
		if !strings.Contains(err.Error(), "unknown authority") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %q lacks %q", err, tc.want)
		}
	}
}
