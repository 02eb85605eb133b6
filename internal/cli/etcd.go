package cli

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdclient"
)

// Etcd is the etcd connection etcdctl's flags describe, shared by every
// helper command that talks to etcd.
type Etcd struct {
	Endpoints      []string
	CACert         string
	Cert           string
	Key            string
	User           string
	Password       string
	DialTimeout    time.Duration
	CommandTimeout time.Duration
	// From names where Endpoints came from, for etcd errors.
	From string
	// CAFrom names the setting CACert came from (--cacert, ETCDCTL_CACERT
	// or the file's line), for an etcd certificate the CA does not verify.
	CAFrom string
}

// Register adds the etcd flags to fs: etcdctl's names and defaults, so
// that an operator's etcdctl environment works unchanged.
func (e *Etcd) Register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&e.Endpoints, "endpoints", []string{"127.0.0.1:2379"}, "etcd endpoints, comma-separated or repeated [env ETCDCTL_ENDPOINTS]")
	fs.StringVar(&e.CACert, "cacert", "", "CA bundle to verify etcd's certificate [env ETCDCTL_CACERT]")
	fs.StringVar(&e.Cert, "cert", "", "client certificate for etcd [env ETCDCTL_CERT]")
	fs.StringVar(&e.Key, "key", "", "client private key for etcd [env ETCDCTL_KEY]")
	fs.StringVar(&e.User, "user", "", "etcd user name, or name:password as etcdctl takes it [env ETCDCTL_USER]")
	fs.StringVar(&e.Password, "password", "", "etcd password; with it --user is the whole name [env ETCDCTL_PASSWORD]")
	fs.DurationVar(&e.DialTimeout, "dial-timeout", 2*time.Second, "etcd dial timeout [env ETCDCTL_DIAL_TIMEOUT]")
	fs.DurationVar(&e.CommandTimeout, "command-timeout", 5*time.Second, "deadline of each etcd request [env ETCDCTL_COMMAND_TIMEOUT]")
}

// EtcdEnvHelp is the help text's paragraph on the environment.
const EtcdEnvHelp = `Environment: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY,
ETCDCTL_USER, ETCDCTL_PASSWORD, ETCDCTL_DIAL_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT as for
etcdctl; a flag beats the environment.`

// EndpointsDefault is From when neither a flag, the environment nor the
// file named the endpoints.
const EndpointsDefault = "the default: neither --endpoints, ETCDCTL_ENDPOINTS nor the configuration file sets them"

// applyEnv fills the etcd settings from etcdctl's environment variables
// where the flag was not given: a flag beats the environment, which beats
// the file. Errors name the variable, never a value that may be a
// password.
func (e *Etcd) applyEnv(fs *pflag.FlagSet, c *Common, env func(string) (string, bool)) error {
	e.From = EndpointsDefault
	if fs.Changed("endpoints") {
		e.From = "from --endpoints"
	} else if where := c.File.Where("endpoints"); where != "" && c.Origin["endpoints"] == where {
		e.From = "from " + where
	}
	// set is the variable of flag, when it is set and the flag not given.
	set := func(flag string, empty bool) (string, bool) {
		name := "ETCDCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
		v, ok := env(name)
		if !ok || (v == "" && !empty) || fs.Changed(flag) {
			return "", false
		}
		c.Origin[flag] = "env " + name
		return v, true
	}
	for _, s := range []struct {
		flag string
		dst  *string
	}{{"cacert", &e.CACert}, {"cert", &e.Cert}, {"key", &e.Key}, {"user", &e.User}, {"password", &e.Password}} {
		if v, ok := set(s.flag, true); ok {
			*s.dst = v
		}
	}
	if v, ok := set("endpoints", false); ok {
		e.Endpoints = nil
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				e.Endpoints = append(e.Endpoints, s)
			}
		}
		e.From = "from ETCDCTL_ENDPOINTS"
	}
	for _, d := range []struct {
		flag string
		dst  *time.Duration
	}{{"dial-timeout", &e.DialTimeout}, {"command-timeout", &e.CommandTimeout}} {
		if v, ok := set(d.flag, false); ok {
			parsed, err := time.ParseDuration(v)
			if err != nil {
				return Usagef("%s=%q: %v", strings.TrimPrefix(c.Origin[d.flag], "env "), v, err)
			}
			*d.dst = parsed
		}
	}
	e.CAFrom = "--cacert"
	switch o := c.Origin["cacert"]; {
	case strings.HasPrefix(o, "env "):
		e.CAFrom = strings.TrimPrefix(o, "env ")
	case o != "" && o != "flag":
		e.CAFrom = "--cacert (" + o + ")"
	}
	// etcdctl takes a --user given without a separate password as
	// name:password.
	if e.User != "" && e.Password == "" {
		name, pw, ok := strings.Cut(e.User, ":")
		if !ok {
			return Usagef("--user %q (or ETCDCTL_USER) has no password: give name:password, or --password / ETCDCTL_PASSWORD", name)
		}
		e.User, e.Password = name, pw
		c.Origin["password"] = c.Origin["user"]
	}
	if e.Password != "" && e.User == "" {
		return Usagef("--password (or ETCDCTL_PASSWORD) given without --user (or ETCDCTL_USER)")
	}
	return nil
}

// Validate checks the settings every etcd command needs.
func (e *Etcd) Validate() []error {
	errs := UsageIf(e.DialTimeout <= 0, "--dial-timeout %s: must be positive", e.DialTimeout)
	errs = append(errs, UsageIf(e.CommandTimeout <= 0, "--command-timeout %s: must be positive", e.CommandTimeout)...)
	errs = append(errs, UsageIf(len(e.Endpoints) == 0, "--endpoints: no etcd endpoint")...)
	return append(errs, UsageIf((e.Cert == "") != (e.Key == ""), "--cert and --key go together")...)
}

// Client connects with the builder confd uses, so that a failure says why
// (refused, unknown authority, bad credentials) within --dial-timeout.
func (e *Etcd) Client(ctx context.Context) (*clientv3.Client, error) {
	return etcdclient.New(ctx, etcdclient.Config{
		Nodes: e.Endpoints, ClientCAKeys: e.CACert, CAFlag: e.caFlag(), ClientCert: e.Cert, ClientKey: e.Key,
		Username: e.User, Password: e.Password, DialTimeout: e.DialTimeout, RequestTimeout: e.CommandTimeout,
	})
}

// caFlag is CAFrom, or --cacert for an Etcd not filled by Resolve.
func (e *Etcd) caFlag() string { return cmp.Or(e.CAFrom, "--cacert") }

// ConnectFailed is the message of a failed connection to etcd.
const ConnectFailed = "cannot connect to etcd: check --endpoints (or ETCDCTL_ENDPOINTS) or endpoints in the configuration file, the TLS and auth settings, and that etcd runs there"

// Err names the endpoints in an etcd error and where they came from
// (--endpoints, ETCDCTL_ENDPOINTS or the default), so that "context
// deadline exceeded" says where it could not get to and which setting to
// fix. The client's own "etcd ENDPOINTS: " prefix is not repeated, nor,
// with one endpoint, the endpoint before each cause.
func (e *Etcd) Err(err error) error {
	if err == nil {
		return nil
	}
	eps := e.Endpoints
	msg := err.Error()
	// The client names endpoints given without a scheme with the one it
	// dialled.
	for _, scheme := range []string{"https://", "http://", ""} {
		named := make([]string, len(eps))
		for i, ep := range eps {
			named[i] = ep
			if !strings.Contains(ep, "://") {
				named[i] = scheme + ep
			}
		}
		msg = strings.TrimPrefix(msg, "etcd "+strings.Join(named, ", ")+": ")
		// (Not a bare host:port: "dial tcp HOST:PORT: ..." keeps it.)
		if len(eps) == 1 && strings.Contains(named[0], "://") {
			msg = strings.ReplaceAll(msg, named[0]+": ", "")
		}
	}
	return &etcdError{msg: fmt.Sprintf("etcd %s (%s): %s", strings.Join(eps, ","), cmp.Or(e.From, EndpointsDefault), msg), err: err}
}

// etcdError is an etcd error reworded by Err; errors.Is still sees the
// cause.
type etcdError struct {
	msg string
	err error
}

func (e *etcdError) Error() string { return e.msg }
func (e *etcdError) Unwrap() error { return e.err }
