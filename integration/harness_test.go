// Package integration drives the built confd binary against real etcd
// servers on loopback, as an operator would.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/testbin"
)

var (
	confdBin   string
	restartBin string
)

func TestMain(m *testing.M) {
	bins, cleanup, err := testbin.Build(nil, map[string]string{"confd": "./cmd/confd", "kube-apiserver-safe-restart": "./cmd/kube-apiserver-safe-restart"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	confdBin, restartBin = bins["confd"], bins["kube-apiserver-safe-restart"]
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// confdir is a confd configuration directory under test.
type confdir struct {
	t   testing.TB
	Dir string // holds conf.d/ and templates/
	Out string // where the resources' dest files go
}

func newConfdir(t testing.TB) *confdir {
	t.Helper()
	c := &confdir{t: t, Dir: t.TempDir(), Out: t.TempDir()}
	for _, d := range []string{"conf.d", "templates"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// resource writes conf.d/NAME.toml (with DEST replaced by the output path
// of NAME) and templates/NAME.tmpl.
func (c *confdir) resource(name, toml, tmpl string) string {
	c.t.Helper()
	dest := filepath.Join(c.Out, name)
	toml = strings.ReplaceAll(toml, "DEST", dest)
	toml = strings.ReplaceAll(toml, "RESTART", restartBin)
	// The template first: a running confd may read conf.d at any moment.
	if tmpl != "" {
		if err := os.WriteFile(filepath.Join(c.Dir, "templates", name+".tmpl"), []byte(tmpl), 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "conf.d", name+".toml"), []byte(toml), 0o644); err != nil {
		c.t.Fatal(err)
	}
	return dest
}

// reporting adds a resource that renders key's value and whose reload_cmd
// reports each render on ev, so that tests await renders, not sleep.
func (c *confdir) reporting(ev *events, name, key string) string {
	c.t.Helper()
	return c.resource(name,
		fmt.Sprintf("[template]\nsrc = %q\ndest = \"DEST\"\nkeys = [%q]\nreload_cmd = \"cat {{.dest}} > %s\"\n", name+".tmpl", key, ev.path),
		fmt.Sprintf("{{getv %q}}\n", key))
}

func (c *confdir) stageFiles() []string {
	c.t.Helper()
	var out []string
	entries, _ := os.ReadDir(c.Out)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

type result struct {
	code           int
	stdout, stderr string
}

// confd runs the binary to completion with a generous deadline.
func confd(t testing.TB, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, confdBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run confd: %v", err)
	}
	return r
}

// startConfd runs a long-lived confd (watch or interval mode), stopped
// with SIGTERM at the end of the test.
func startConfd(t testing.TB, args ...string) *bytes.Buffer {
	t.Helper()
	cmd := exec.Command(confdBin, args...)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &errb, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("confd did not stop on SIGTERM; output:\n%s", errb.String())
		}
	})
	return &errb
}

// startReporting starts a long-lived confd and waits for its first render,
// which must report first.
func startReporting(t testing.TB, ev *events, first string, args ...string) fmt.Stringer {
	t.Helper()
	log := startConfd(t, args...)
	if got := ev.next(t, 20*time.Second, log); got != first {
		t.Fatalf("first render = %q, want %q", got, first)
	}
	return log
}

// events is a FIFO that reload commands write to, so a test can await a
// reload instead of sleeping.
type events struct {
	path  string
	lines chan string
}

func newEvents(t testing.TB) *events {
	t.Helper()
	p := filepath.Join(t.TempDir(), "events")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	e := &events{path: p, lines: make(chan string, 100)}
	// O_RDWR keeps the FIFO open for writers across their open/close cycles.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	go func() {
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			acc += string(buf[:n])
			for {
				i := strings.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				e.lines <- acc[:i]
				acc = acc[i+1:]
			}
		}
	}()
	return e
}

func (e *events) next(t testing.TB, within time.Duration, log fmt.Stringer) string {
	t.Helper()
	select {
	case l := <-e.lines:
		return l
	case <-time.After(within):
		t.Fatalf("no event within %s; confd output:\n%s", within, log)
		return ""
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// nodeArgs points confd at s, with an empty confd.toml so that a host's
// /etc/confd/confd.toml cannot leak into the test.
func nodeArgs(t testing.TB, s *etcdtest.Server) []string {
	t.Helper()
	empty := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"-backend", "etcdv3", "-node", s.Endpoint, "-config-file", empty}
}
