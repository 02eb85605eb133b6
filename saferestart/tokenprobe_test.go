package saferestart

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
)

// The probe's settings come from safe-restart.toml as from the command
// line, and a bad one is a usage error only where the probe would run.
func TestTokenProbeFlags(t *testing.T) {
	path := writeConfig(t, `endpoints = ["https://10.0.0.1:2379"]
token-probe-kubeconfig = "/etc/kubernetes/token-probe.conf"
token-probe-interval = "2s"
token-probe-apiservers = ["m1=https://10.0.0.1:6443", "m2=https://10.0.0.2:6443"]
`)
	o, _, err := parseArgs([]string{"--config", path, "publish-key", "--watch"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := opts[*keycmd.PublishKey](t, o).TokenProbe
	want := cmdkit.TokenProbe{TokenProbeKubeconfig: "/etc/kubernetes/token-probe.conf", TokenProbeServiceAccount: "kube-system/kube-apiserver-token-probe",
		TokenProbeInterval: 2 * time.Second, TokenProbeAPIServers: []string{"m1=https://10.0.0.1:6443", "m2=https://10.0.0.2:6443"}}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("from the file: %+v, want %+v", p, want)
	}
	o, _, err = parseArgs([]string{"--config", path, "publish-key", "--watch", "--token-probe-apiservers", "a=https://a:1,b=https://b:1", "--token-probe-apiservers", "c=https://c:1"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := opts[*keycmd.PublishKey](t, o).TokenProbeAPIServers; len(got) != 3 {
		t.Errorf("comma list and repeated flag: %q, want 3 items replacing the file's", got)
	}
	for _, args := range [][]string{
		{"publish-key", "--watch", "--token-probe-kubeconfig", "k", "--token-probe-apiservers", "m1"},
		{"publish-key", "--watch", "--token-probe-kubeconfig", "k", "--token-probe-service-account", "probe"},
		{"publish-key", "--watch", "--token-probe-kubeconfig", "k", "--token-probe-interval", "0s"},
	} {
		var ue *cli.UsageError
		if _, _, err := parseArgs(append([]string{"--endpoints", "https://e:2379"}, args...), env(nil)); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	// Without the kubeconfig the probe does not run: nothing to refuse.
	if _, _, err := parseArgs([]string{"--endpoints", "https://e:2379", "publish-key", "--watch", "--token-probe-apiservers", "m1"}, env(nil)); err != nil {
		t.Errorf("probe settings without --token-probe-kubeconfig: %v", err)
	}
}
