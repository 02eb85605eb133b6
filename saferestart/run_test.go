package saferestart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// run is runWith with the etcd flags' client.
func run(ctx context.Context, force <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, force, args, stdout, stderr, nil)
}

// An unreachable etcd is exit 1 within the deadlines, with a JSON log line
// naming the endpoint when --log-format json.
func TestUnreachableEtcdJSONLog(t *testing.T) {
	dead := etcdtest.UnusedEndpoint(t)
	var out, errb bytes.Buffer
	code := run(context.Background(), nil, []string{"status", "--endpoints", dead, "--dial-timeout", "100ms",
		"--command-timeout", "300ms", "--log-format", "json"}, &out, &errb)
	if code != cmdkit.ExitError {
		t.Fatalf("exit %d, want %d; stderr %s", code, cmdkit.ExitError, errb.String())
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

// newLogger is the helper's logger as run makes it.
func newLogger(w io.Writer, level, format string) (*logrus.Logger, error) {
	return (&cli.Common{LogLevel: level, LogFormat: format}).Logger(w, os.Getenv)
}

// Not under confd, confd's own format (time, host, name[pid]: LEVEL, as
// confd 0.16 logs), redacted.
func TestLogsRedacted(t *testing.T) {
	t.Setenv("CONFD_RESOURCE", "")
	var b bytes.Buffer
	log, err := newLogger(&b, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIsecret\n-----END EC PRIVATE KEY-----")
	prefix := regexp.MustCompile(`^\S+ \S+ ` + regexp.QuoteMeta(filepath.Base(os.Args[0])) + fmt.Sprintf(`\[%d\]: INFO `, os.Getpid()))
	if strings.Contains(b.String(), "MHcCAQEEIsecret") || !prefix.MatchString(b.String()) {
		t.Errorf("log %q", b.String())
	}
}

// An etcd that cannot be reached is named with the setting that named it,
// once, and the message says what to check.
func TestEtcdErrorNamesTheEndpointsSetting(t *testing.T) {
	dead := etcdtest.UnusedEndpoint(t)
	port := dead[strings.LastIndex(dead, ":")+1:]
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"flag", []string{"--endpoints", dead}, "", "etcd " + dead + " (from --endpoints): no connection within 300ms: unreachable: dial tcp 127.0.0.1:" + port + ": connect: connection refused"},
		{"environment", nil, dead, "etcd " + dead + " (from ETCDCTL_ENDPOINTS): no connection within 300ms: unreachable: dial tcp 127.0.0.1:" + port + ": connect: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("ETCDCTL_ENDPOINTS", tc.env)
			var out, errb bytes.Buffer
			args := append([]string{"status", "--dial-timeout", "300ms", "--log-format", "json"}, tc.args...)
			if code := run(context.Background(), nil, args, &out, &errb); code != cmdkit.ExitError {
				t.Fatalf("exit %d, want %d; stderr %s", code, cmdkit.ExitError, errb.String())
			}
			var entry map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(errb.String())), &entry); err != nil {
				t.Fatalf("log is not one JSON line: %v\n%s", err, errb.String())
			}
			if entry["msg"] != cli.ConnectFailed || !strings.Contains(entry["msg"].(string), "--endpoints (or ETCDCTL_ENDPOINTS)") {
				t.Errorf("msg %q", entry["msg"])
			}
			if e, _ := entry["error"].(string); !strings.Contains(e, tc.want) {
				t.Errorf("error %q, want it to contain %q", e, tc.want)
			}
		})
	}
}

// Without --endpoints or ETCDCTL_ENDPOINTS the error says the default was
// used (no network here: something may listen on 2379).
func TestEtcdErrorDefaultEndpoints(t *testing.T) {
	o, _, err := parseArgs([]string{"status"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	a := o.env(io.Discard, nil)
	cause := errors.New("etcd http://127.0.0.1:2379: no connection within 2s: http://127.0.0.1:2379: unreachable: dial tcp 127.0.0.1:2379: connect: connection refused")
	got := a.Etcd.Err(cause)
	want := "etcd 127.0.0.1:2379 (the default: neither --endpoints, ETCDCTL_ENDPOINTS nor the configuration file sets them): no connection within 2s: unreachable: dial tcp 127.0.0.1:2379: connect: connection refused"
	if got.Error() != want || !errors.Is(got, cause) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
