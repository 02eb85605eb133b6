package saferestart

import (
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
)

func TestRestartModeFlags(t *testing.T) {
	o, _, err := parseRestart(t, []string{"--restart-mode", "static-pod", "--cri-endpoint", "unix:///run/containerd/containerd.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Argv) < 2 || o.Argv[1] != restartcmd.StaticPodArg ||
		strings.Join(o.Argv[2:], " ") != "--cri-endpoint unix:///run/containerd/containerd.sock --container kube-apiserver --static-pod-stop-timeout 30s" {
		t.Errorf("static-pod command %q", o.Argv)
	}
	if o.RestartTimeout != 30*time.Second+5*time.Minute+30*time.Second {
		t.Errorf("static-pod --restart-timeout default %s, want the stop timeout, the kubelet's 5m back-off and 30s", o.RestartTimeout)
	}
	o, _, err = parseRestart(t, []string{"--restart-mode", "static-pod", "--restart-timeout", "2m", "--static-pod-stop-timeout", "10s"})
	if err != nil || o.RestartTimeout != 2*time.Minute || !strings.Contains(strings.Join(o.Argv, " "), "--static-pod-stop-timeout 10s") {
		t.Errorf("explicit --restart-timeout: %v %s %q", err, o.RestartTimeout, o.Argv)
	}
	// The command after -- overrides both modes.
	o, _, err = parseRestart(t, []string{"--restart-mode", "static-pod", "--", "my-restart"})
	if err != nil || strings.Join(o.Argv, " ") != "my-restart" {
		t.Errorf("-- COMMAND: %v %q", err, o.Argv)
	}
	o, _, err = parseRestart(t, nil)
	if err != nil || strings.Join(o.Argv, " ") != "systemctl restart kube-apiserver.service" || o.RestartTimeout != 3*time.Minute {
		t.Errorf("systemd default: %v %q %s", err, o.Argv, o.RestartTimeout)
	}
	for _, bad := range [][]string{
		{"--restart-mode", "docker"},
		{"--restart-mode", "static-pod", "--static-pod-stop-timeout", "500ms"},
		{"status", "--restart-mode", "static-pod"},
	} {
		if _, _, err := parseArgs(bad, env(nil)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestStaticPodMainUsage(t *testing.T) {
	if code := restartcmd.StaticPodMain([]string{"--cri-endpoint", "x"}); code != cmdkit.ExitUsage {
		t.Errorf("no --container: exit %d", code)
	}
}

// The configuration file's restart-mode chooses the command, as the
// kubeadm example relies on; its restart-timeout beats the static-pod
// default. (Before the commands had their own flags, the command was
// chosen before the file was read: a file's static-pod ran systemctl.)
func TestRestartModeFromFile(t *testing.T) {
	path := writeConfig(t, "restart-mode = \"static-pod\"\n")
	o, _, err := parseRestart(t, []string{"--config", path})
	if err != nil || len(o.Argv) < 2 || o.Argv[1] != restartcmd.StaticPodArg || o.RestartTimeout != 6*time.Minute {
		t.Fatalf("%v: argv %q, restart-timeout %s", err, o.Argv, o.RestartTimeout)
	}
	path = writeConfig(t, "restart-mode = \"static-pod\"\nrestart-timeout = \"4m\"\n")
	if o, _, err = parseRestart(t, []string{"--config", path}); err != nil || o.RestartTimeout != 4*time.Minute {
		t.Fatalf("%v: restart-timeout %s, want the file's", err, o.RestartTimeout)
	}
}
