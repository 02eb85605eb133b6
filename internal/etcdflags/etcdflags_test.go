package etcdflags

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type vals struct {
	endpoints                         []string
	cacert, cert, key, user, password string
	dial, command                     time.Duration
}

func (v *vals) targets() Targets {
	return Targets{Endpoints: &v.endpoints, CACert: &v.cacert, Cert: &v.cert, Key: &v.key, User: &v.user,
		Password: &v.password, DialTimeout: &v.dial, CommandTimeout: &v.command}
}

func parse(t *testing.T, args []string, env map[string]string) (*vals, map[string]string, error) {
	t.Helper()
	v := &vals{}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	Register(fs, v.targets())
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	from := map[string]string{}
	err := ApplyEnv(fs, v.targets(), func(k string) (string, bool) { s, ok := env[k]; return s, ok },
		func(flag, variable string) { from[flag] = variable })
	if err == nil {
		_, err = SplitUser(&v.user, &v.password)
	}
	return v, from, err
}

// etcdctl's defaults, its variables, and a flag beating the variable.
func TestFlagsBeatEnvironment(t *testing.T) {
	v, from, err := parse(t, []string{"--cacert", "flag.crt"}, map[string]string{
		"ETCDCTL_CACERT": "env.crt", "ETCDCTL_CERT": "env-cert", "ETCDCTL_ENDPOINTS": " https://a:2379, ,https://b:2379",
		"ETCDCTL_DIAL_TIMEOUT": "7s",
	})
	if err != nil {
		t.Fatal(err)
	}
	if v.cacert != "flag.crt" || v.cert != "env-cert" || v.dial != 7*time.Second || v.command != 5*time.Second {
		t.Errorf("got %+v", v)
	}
	if !slices.Equal(v.endpoints, []string{"https://a:2379", "https://b:2379"}) {
		t.Errorf("endpoints %q", v.endpoints)
	}
	if from["cacert"] != "" || from["cert"] != "ETCDCTL_CERT" || from["endpoints"] != "ETCDCTL_ENDPOINTS" {
		t.Errorf("from %v", from)
	}
	if v, _, _ := parse(t, nil, nil); !slices.Equal(v.endpoints, []string{"127.0.0.1:2379"}) || v.dial != 2*time.Second {
		t.Errorf("defaults %+v", v)
	}
}

// --user name:password is split as etcdctl splits it; the errors name the
// variable and never the password.
func TestUserAndErrors(t *testing.T) {
	v, _, err := parse(t, []string{"--user", "root:s3cret"}, nil)
	if err != nil || v.user != "root" || v.password != "s3cret" {
		t.Fatalf("%+v %v", v, err)
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
		_, _, err := parse(t, c.args, c.env)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v %v: error %v, want one naming %q without the password", c.args, c.env, err, c.want)
		}
	}
}
