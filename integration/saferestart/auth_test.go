package saferestart

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// ETCDCTL_USER and ETCDCTL_PASSWORD work as in etcdctl, against an etcd
// with authentication on; the password never reaches the log or the
// restart command's environment.
func TestEtcdAuth(t *testing.T) {
	t.Parallel()
	const pw = "s3cret-pw-never-shown"
	s := etcdtest.Start(t)
	s.EnableAuth(t, pw, "reader", "reader-pw", "/nothing/")
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"user:password", []string{"ETCDCTL_USER=root:" + pw}, nil, codeOK},
		{"user and password", []string{"ETCDCTL_USER=root", "ETCDCTL_PASSWORD=" + pw}, nil, codeOK},
		{"flags", nil, []string{"--user", "root", "--password", pw}, codeOK},
		{"wrong password", []string{"ETCDCTL_USER=root:wrong-" + pw}, nil, codeError},
		{"no credentials", nil, nil, codeError},
		{"user without password", []string{"ETCDCTL_USER=root"}, nil, codeUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.Remove(envFile)
			args := append(lockArgs("authlock", tc.args...), "--", "sh", "-c", "env > "+envFile)
			p := runBin(t, env(s, tc.env...), args...)
			if p.code != tc.want {
				t.Fatalf("exit %d, want %d\n%s", p.code, tc.want, p.stderr)
			}
			if strings.Contains(p.stderr.String()+p.stdout.String(), pw) {
				t.Fatalf("password in the output:\n%s", p.stderr)
			}
			if tc.want == codeError && !strings.Contains(p.stderr.String(), "authenticat") {
				t.Fatalf("the error does not say authentication failed:\n%s", p.stderr)
			}
			if tc.want != codeOK {
				return
			}
			data, err := os.ReadFile(envFile)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(data), pw) || strings.Contains(string(data), "ETCDCTL_USER") {
				t.Fatal("credentials in the restart command's environment")
			}
			if st := runBin(t, env(s, tc.env...), append([]string{"--lock-name", "authlock", "status"}, tc.args...)...); st.code != codeOK {
				t.Fatalf("status exit %d\n%s", st.code, st.stderr)
			}
		})
	}
}

// --dial-timeout bounds a connection to an endpoint that accepts TCP but
// never answers, and the error names it.
func TestDialTimeoutHonoured(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	start := time.Now()
	p := runBin(t, env(nil), "status", "--endpoints", ln.Addr().String(), "--dial-timeout", "500ms", "--command-timeout", "60s")
	if p.code != codeError || !strings.Contains(p.stderr.String(), ln.Addr().String()) {
		t.Fatalf("exit %d\n%s", p.code, p.stderr)
	}
	// Without --dial-timeout the 60 s command timeout would bound it.
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %s with --dial-timeout 500ms", d)
	}
}

// --dry-run prints the worst-case duration of a run, which confd's
// reload_cmd_timeout must exceed.
func TestDryRunWorstCase(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	p := runBin(t, env(s), "--lock-name", "dry", "--dry-run", "-o", "json")
	if p.code != codeOK {
		t.Fatalf("exit %d\n%s", p.code, p.stderr)
	}
	var plan struct {
		WorstCase        string `json:"worst_case"`
		WorstCaseSeconds int    `json:"worst_case_seconds"`
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &plan); err != nil {
		t.Fatalf("%v\n%s", err, p.stdout)
	}
	// Defaults: dial 2s, preflight 3×30s, hostname -f 5s, probe 5s, etcd 3×5s,
	// trust gate 5s + 15m, lock 10m, restart intent 2×5s, 2×(restart 3m + grace 5s + health 3m
	// + 5s), retry 5s, trust record 5s, hold 30s+5s, release 10s.
	if plan.WorstCaseSeconds != 2427 || plan.WorstCase != "40m27s" {
		t.Fatalf("worst case %+v, want 2427 s", plan)
	}
	text := runBin(t, env(s), "--lock-name", "dry", "--dry-run", "--lock-timeout", "1m", "--trust-timeout", "0", "--host", "m1")
	if !strings.Contains(text.stdout.String(), "worst case: 16m17s (977 seconds)") ||
		!strings.Contains(text.stdout.String(), "     60s  lock wait (--lock-timeout)") {
		t.Fatalf("text dry run:\n%s", text.stdout)
	}
}
