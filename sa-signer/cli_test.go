package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) lookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestFlagsAndEnvironment pins the defaults the issue names and etcdctl's
// environment with a flag beating it, as kube-apiserver-safe-restart does.
func TestFlagsAndEnvironment(t *testing.T) {
	o, _, err := parseArgs(nil, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.socket != "/run/kube-apiserver-sa-signer/signer.sock" || o.keysPrefix != "/kubernetes/service-account-keys/" ||
		o.trustPrefix != "/kubernetes/service-account-keys-trust/" || o.refreshHint != 10*time.Second ||
		o.maxTokenExpiration != 8760*time.Hour || o.signingKey != "/etc/kubernetes/pki/sa.key" || o.gid != -1 {
		t.Errorf("defaults: %+v", o)
	}

	env := envOf(map[string]string{"ETCDCTL_ENDPOINTS": "https://a:2379, https://b:2379", "ETCDCTL_USER": "root:pw",
		"ETCDCTL_CACERT": "/ca", "ETCDCTL_DIAL_TIMEOUT": "7s"})
	o, _, err = parseArgs([]string{"--cacert=/flag-ca"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.endpoints, []string{"https://a:2379", "https://b:2379"}) || o.user != "root" || o.password != "pw" ||
		o.cacert != "/flag-ca" || o.dialTimeout != 7*time.Second {
		t.Errorf("environment: %+v", o)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-token-expiration=9m"}, "--max-token-expiration"},
		{[]string{"--refresh-hint=1500ms"}, "--refresh-hint"},
		{[]string{"--keys-prefix=/"}, "--keys-prefix"},
		{[]string{"--cert=/c"}, "--cert and --key"},
		{[]string{"--socket-group=no-such-group-here"}, "--socket-group"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		if _, _, err := parseArgs(tc.args, envOf(nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
