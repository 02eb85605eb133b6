// Package etcdflags defines the etcd connection flags that
// kube-apiserver-safe-restart and kube-apiserver-sa-signer share with
// etcdctl: the same names, the same ETCDCTL_* variables and etcdctl's
// name:password form of --user, so that an operator's etcdctl environment
// works unchanged and the two binaries cannot drift apart.
package etcdflags

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Targets are where the flags' values go: each binary keeps them in its
// own options.
type Targets struct {
	Endpoints                         *[]string
	CACert, Cert, Key, User, Password *string
	DialTimeout, CommandTimeout       *time.Duration
}

// Register defines the flags with etcdctl's defaults.
func Register(fs *pflag.FlagSet, t Targets) {
	fs.StringSliceVar(t.Endpoints, "endpoints", []string{"127.0.0.1:2379"}, "etcd endpoints, comma-separated or repeated [env ETCDCTL_ENDPOINTS]")
	fs.StringVar(t.CACert, "cacert", "", "CA bundle to verify etcd's certificate [env ETCDCTL_CACERT]")
	fs.StringVar(t.Cert, "cert", "", "client certificate for etcd [env ETCDCTL_CERT]")
	fs.StringVar(t.Key, "key", "", "client private key for etcd [env ETCDCTL_KEY]")
	fs.StringVar(t.User, "user", "", "etcd user name, or name:password as etcdctl takes it [env ETCDCTL_USER]")
	fs.StringVar(t.Password, "password", "", "etcd password; with it --user is the whole name [env ETCDCTL_PASSWORD]")
	fs.DurationVar(t.DialTimeout, "dial-timeout", 2*time.Second, "etcd dial timeout [env ETCDCTL_DIAL_TIMEOUT]")
	fs.DurationVar(t.CommandTimeout, "command-timeout", 5*time.Second, "deadline of each etcd request [env ETCDCTL_COMMAND_TIMEOUT]")
}

// EnvHelp is the help text's paragraph on the environment.
const EnvHelp = `Environment: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY,
ETCDCTL_USER, ETCDCTL_PASSWORD, ETCDCTL_DIAL_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT as for
etcdctl; a flag beats the environment.`

// ApplyEnv fills, from etcdctl's environment variables, each flag the
// command line did not give (a value from a configuration file is
// replaced: flag > environment > file). from is told each flag taken from
// the environment and the variable's name; it may be nil. Errors name the
// variable, never a value that may be a password.
func ApplyEnv(fs *pflag.FlagSet, t Targets, env func(string) (string, bool), from func(flag, variable string)) error {
	if from == nil {
		from = func(string, string) {}
	}
	for _, s := range []struct {
		flag string
		dst  *string
	}{{"cacert", t.CACert}, {"cert", t.Cert}, {"key", t.Key}, {"user", t.User}, {"password", t.Password}} {
		name := variable(s.flag)
		if v, ok := env(name); ok && !fs.Changed(s.flag) {
			*s.dst = v
			from(s.flag, name)
		}
	}
	if v, ok := env("ETCDCTL_ENDPOINTS"); ok && v != "" && !fs.Changed("endpoints") {
		*t.Endpoints = SplitList(v)
		from("endpoints", "ETCDCTL_ENDPOINTS")
	}
	for _, d := range []struct {
		flag string
		dst  *time.Duration
	}{{"dial-timeout", t.DialTimeout}, {"command-timeout", t.CommandTimeout}} {
		name := variable(d.flag)
		if v, ok := env(name); ok && v != "" && !fs.Changed(d.flag) {
			parsed, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("%s=%q: %w", name, v, err)
			}
			*d.dst = parsed
			from(d.flag, name)
		}
	}
	return nil
}

// SplitUser does what etcdctl does with a --user given without a separate
// password: it is name:password. split reports whether it was.
func SplitUser(user, password *string) (split bool, err error) {
	if *user != "" && *password == "" {
		name, pw, ok := strings.Cut(*user, ":")
		if !ok {
			return false, fmt.Errorf("--user %q (or ETCDCTL_USER) has no password: give name:password, or --password / ETCDCTL_PASSWORD", name)
		}
		*user, *password = name, pw
		split = true
	}
	if *password != "" && *user == "" {
		return split, fmt.Errorf("--password (or ETCDCTL_PASSWORD) given without --user (or ETCDCTL_USER)")
	}
	return split, nil
}

// variable is etcdctl's environment variable for a flag.
func variable(flag string) string {
	return "ETCDCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// SplitList splits a comma-separated list, dropping blanks.
func SplitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
