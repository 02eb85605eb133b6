package textfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Each command's run replaces its own samples and keeps the other's.
func TestWriteKeepsOtherCommands(t *testing.T) {
	path := filepath.Join(t.TempDir(), "safe-restart.prom")
	t1 := time.Unix(1700000000, 500e6)
	if err := Write(path, "restart", 0, t1); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, "rotate-key", 3, t1.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, "restart", 5, t1.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := `# HELP kube_apiserver_safe_restart_last_run_timestamp_seconds When the command last ended (Unix seconds).
# TYPE kube_apiserver_safe_restart_last_run_timestamp_seconds gauge
kube_apiserver_safe_restart_last_run_timestamp_seconds{command="restart"} 1700000120.5
kube_apiserver_safe_restart_last_run_timestamp_seconds{command="rotate-key"} 1700000060.5
# HELP kube_apiserver_safe_restart_last_run_exit_code The exit code the command last ended with (0 ok; see kube-apiserver-safe-restart --help).
# TYPE kube_apiserver_safe_restart_last_run_exit_code gauge
kube_apiserver_safe_restart_last_run_exit_code{command="restart"} 5
kube_apiserver_safe_restart_last_run_exit_code{command="rotate-key"} 3
`
	if string(b) != want {
		t.Errorf("file:\n%s\nwant:\n%s", b, want)
	}
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(ents) != 1 {
		t.Errorf("stage files left: %v %v", ents, err)
	}
}

// A directory that is not there is an error naming the flag.
func TestWriteMissingDirectory(t *testing.T) {
	err := Write(filepath.Join(t.TempDir(), "none", "x.prom"), "restart", 0, time.Now())
	if err == nil || !strings.Contains(err.Error(), "--metrics-textfile") {
		t.Errorf("err = %v", err)
	}
}
