package main

import (
	"bytes"
	"context"
	"encoding/json"
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
