package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// An unreachable etcd is exit 1 within the deadlines, with a JSON log line
// naming the endpoint when --log-format json.
func TestUnreachableEtcdJSONLog(t *testing.T) {
	dead := etcdtest.UnusedEndpoint(t)
	var out, errb bytes.Buffer
	code := run(context.Background(), nil, []string{"status", "--endpoints", dead, "--dial-timeout", "100ms",
		"--command-timeout", "300ms", "--log-format", "json"}, &out, &errb)
	if code != exitError {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitError, errb.String())
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(errb.String())), &entry); err != nil {
		t.Fatalf("log is not one JSON line: %v\n%s", err, errb.String())
	}
	if entry["level"] != "error" || !strings.Contains(entry["error"].(string), dead) {
		t.Fatalf("log entry %v", entry)
	}
}

func TestCheckIgnoresEtcdEnv(t *testing.T) {
	if _, _, err := parseArgs([]string{"check", "f"}, env(map[string]string{"ETCDCTL_DIAL_TIMEOUT": "soon"})); err != nil {
		t.Fatalf("check must not read etcd settings: %v", err)
	}
}

// Under confd (CONFD_RESOURCE set) the helper logs in confd's format
// without time and host, one plain line that confd logs unquoted under
// its own prefix; --log-format json stays valid JSON, without a time.
func TestLogsUnderConfd(t *testing.T) {
	t.Setenv("CONFD_RESOURCE", "/etc/confd/conf.d/sa.toml")
	var b bytes.Buffer
	log, err := newLogger(&b, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	log.WithField("lock", "kube-apiserver-restart").Info("restart command started")
	want := fmt.Sprintf("%s[%d]: INFO restart command started lock=kube-apiserver-restart\n", filepath.Base(os.Args[0]), os.Getpid())
	if b.String() != want {
		t.Errorf("text log %q, want %q", b.String(), want)
	}
	b.Reset()
	log, err = newLogger(&b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x")
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["msg"] != "x" || rec["time"] != nil {
		t.Errorf("json log %q: %v", b.String(), err)
	}
}

// Not under confd, the helper's own format, now redacted.
func TestLogsRedacted(t *testing.T) {
	t.Setenv("CONFD_RESOURCE", "")
	var b bytes.Buffer
	log, err := newLogger(&b, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIsecret\n-----END EC PRIVATE KEY-----")
	if strings.Contains(b.String(), "MHcCAQEEIsecret") || !strings.Contains(b.String(), "time=") {
		t.Errorf("log %q", b.String())
	}
}
