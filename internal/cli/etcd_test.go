package cli

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

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

// parseEtcd is a command line and environment through the etcd flags,
// etcdctl's variables and --user's split.
func parseEtcd(t *testing.T, args []string, env map[string]string) (*Etcd, map[string]string, error) {
	t.Helper()
	e := &Etcd{}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	e.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	c := &Common{Origin: map[string]string{}}
	err := e.applyEnv(fs, c, func(k string) (string, bool) { s, ok := env[k]; return s, ok })
	return e, c.Origin, err
}

// etcdctl's defaults, its variables, and a flag beating the variable.
func TestFlagsBeatEnvironment(t *testing.T) {
	e, from, err := parseEtcd(t, []string{"--cacert", "flag.crt"}, map[string]string{
		"ETCDCTL_CACERT": "env.crt", "ETCDCTL_CERT": "env-cert", "ETCDCTL_ENDPOINTS": " https://a:2379, ,https://b:2379",
		"ETCDCTL_DIAL_TIMEOUT": "7s",
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.CACert != "flag.crt" || e.Cert != "env-cert" || e.DialTimeout != 7*time.Second || e.CommandTimeout != 5*time.Second {
		t.Errorf("got %+v", e)
	}
	if !slices.Equal(e.Endpoints, []string{"https://a:2379", "https://b:2379"}) {
		t.Errorf("endpoints %q", e.Endpoints)
	}
	if from["cacert"] != "" || from["cert"] != "env ETCDCTL_CERT" || from["endpoints"] != "env ETCDCTL_ENDPOINTS" {
		t.Errorf("from %v", from)
	}
	if e, _, _ := parseEtcd(t, nil, nil); !slices.Equal(e.Endpoints, []string{"127.0.0.1:2379"}) || e.DialTimeout != 2*time.Second {
		t.Errorf("defaults %+v", e)
	}
}

// --user name:password is split as etcdctl splits it; the errors name the
// variable and never the password.
func TestUserAndErrors(t *testing.T) {
	e, _, err := parseEtcd(t, []string{"--user", "root:s3cret"}, nil)
	if err != nil || e.User != "root" || e.Password != "s3cret" {
		t.Fatalf("%+v %v", e, err)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--user", "root"}, nil, "has no password"},
		{nil, map[string]string{"ETCDCTL_PASSWORD": "s3cret"}, "without --user"},
		{nil, map[string]string{"ETCDCTL_COMMAND_TIMEOUT": "soon"}, "ETCDCTL_COMMAND_TIMEOUT"},
	} {
		_, _, err := parseEtcd(t, c.args, c.env)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v %v: error %v, want one naming %q without the password", c.args, c.env, err, c.want)
		}
	}
}
