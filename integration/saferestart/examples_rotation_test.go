package saferestart

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// unitLines returns the values of key= lines in a shipped unit file,
// continuation lines joined.
func unitLines(t *testing.T, rel, key string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(etcdtest.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if cur != "" {
			cur += " " + strings.TrimSpace(strings.TrimSuffix(line, "\\"))
			if !strings.HasSuffix(line, "\\") {
				out = append(out, cur)
				cur = ""
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			if strings.HasSuffix(v, "\\") {
				cur = strings.TrimSpace(strings.TrimSuffix(v, "\\"))
				continue
			}
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %s= line", rel, key)
	}
	return out
}

// moved rewrites a shipped command line for a test root: the binary's path
// and /etc/kubernetes.
func moved(cmd, root string) string {
	cmd = strings.ReplaceAll(cmd, "/usr/local/bin/kube-apiserver-safe-restart", binPath)
	return strings.ReplaceAll(cmd, "/etc/kubernetes", root)
}

// installConfig writes the shipped safe-restart.toml to root, paths moved
// like the units', and returns the environment that runs the units there:
// etcd is srv (plain HTTP), which the ETCDCTL_* variables say, beating the
// file's TLS settings as they would on a host.
func installConfig(t *testing.T, root string, srv *etcdtest.Server) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(etcdtest.RepoRoot(), "examples", "safe-restart.toml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "safe-restart.toml"), []byte(moved(string(data), root)))
	return env(srv, "ETCDCTL_CACERT=", "ETCDCTL_CERT=", "ETCDCTL_KEY=")
}

func selfFQDN(t *testing.T) string {
	out, err := exec.Command("hostname", "-f").Output()
	if err != nil {
		t.Skipf("hostname -f: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// The drop-in's ExecStartPre, run as shipped (paths moved): it fails naming
// the host that does not trust this host's signing key yet, passes once it
// does, passes at once for a key this host already signed with (a restart
// under the helper's lock must never wait on hosts that need that lock), and
// the documented escape file skips it for a first master.
func TestWaitTrustedDropIn(t *testing.T) {
	srv := etcdtest.Start(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "pki"), 0o755); err != nil {
		t.Fatal(err)
	}
	priv, pub := newKeyPair(t)
	_, otherPub := newKeyPair(t)
	_, nextPub := newKeyPair(t)
	writeFile(t, filepath.Join(root, "pki", "sa.key"), priv)
	// As during rotate-key: sa.pub also holds the next key, which nobody
	// trusts yet and which the apiserver does not sign with.
	writeFile(t, filepath.Join(root, "pki", "sa.pub"), append(append([]byte(nil), pub...), nextPub...))
	self := selfFQDN(t)
	srv.Put(t, keysPrefix+"/"+self, string(pub))
	srv.Put(t, keysPrefix+"/other.example", string(otherPub))
	pre := unitLines(t, "examples/systemd/kube-apiserver.service.d/10-wait-trusted.conf", "ExecStartPre")[0]
	if !strings.HasPrefix(pre, "/bin/sh -c '") {
		t.Fatalf("ExecStartPre is not the expected sh -c line: %s", pre)
	}
	script := strings.TrimSuffix(strings.TrimPrefix(moved(pre, root), "/bin/sh -c '"), "'")
	script = strings.ReplaceAll(script, "--timeout 15m", "--timeout 2s")
	unitEnv := installConfig(t, root, srv)
	run := func() *proc {
		p := startProc(t, unitEnv, "/bin/sh", "-c", script)
		p.wait(t)
		return p
	}
	otherKid := fileKids(t, writeFile(t, filepath.Join(root, "other.pub"), otherPub))[0]
	srv.Put(t, trustPrefix+"/other.example", `{"host":"other.example","trusted":["`+otherKid+`"],"bundle_sha256":"x","time":"`+time.Now().UTC().Format(time.RFC3339)+`"}`)
	if p := run(); p.code != codeLockTimeout || !strings.Contains(p.stdout.String()+p.stderr.String(), "other.example") || strings.Contains(p.stdout.String(), self) {
		t.Fatalf("drop-in with other.example not trusting: exit %d, want 5 naming it (and not this host)\n%s%s", p.code, p.stdout, p.stderr)
	}
	kid := fileKids(t, filepath.Join(root, "pki", "sa.pub"))[0]
	srv.Put(t, trustPrefix+"/other.example", `{"host":"other.example","trusted":["`+kid+`"],"bundle_sha256":"x","time":"`+time.Now().UTC().Format(time.RFC3339)+`"}`)
	if p := run(); p.code != codeOK {
		t.Fatalf("drop-in once trusted: exit %d\n%s", p.code, p.stderr)
	}
	// A restart with the key this host already signed with: other.example
	// dropped it meanwhile (its bundle lost this host's key), but only a
	// restart of other.example, which may wait for the lock held by the
	// helper that runs this, can fix that.
	srv.Put(t, trustPrefix+"/other.example", `{"host":"other.example","trusted":["`+otherKid+`"],"bundle_sha256":"x","time":"`+time.Now().UTC().Format(time.RFC3339)+`"}`)
	srv.Put(t, trustPrefix+"/"+self, `{"host":"`+self+`","trusted":["`+kid+`","`+otherKid+`"],"signing":"`+kid+`","bundle_sha256":"x","time":"`+time.Now().UTC().Format(time.RFC3339)+`"}`)
	if p := run(); p.code != codeOK || !strings.Contains(p.stdout.String(), "no new key") {
		t.Fatalf("drop-in for the key this host signed with: exit %d, want 0 at once\n%s%s", p.code, p.stdout, p.stderr)
	}
	// Escape for a first master: no etcd needed at all.
	writeFile(t, filepath.Join(root, "sa-wait-trusted.skip"), nil)
	srv.Stop()
	if p := run(); p.code != codeOK {
		t.Fatalf("drop-in with the skip file: exit %d\n%s", p.code, p.stderr)
	}
}

// sa-key-retire.service as shipped: with no rotation due it does nothing
// and succeeds (the timer runs it hourly on every master).
func TestRetireUnitNothingDue(t *testing.T) {
	srv := etcdtest.Start(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "pki"), 0o755); err != nil {
		t.Fatal(err)
	}
	priv, pub := newKeyPair(t)
	writeFile(t, filepath.Join(root, "pki", "sa.key"), priv)
	writeFile(t, filepath.Join(root, "pki", "sa.pub"), pub)
	cmd := moved(unitLines(t, "examples/systemd/sa-key-retire.service", "ExecStart")[0], root)
	p := startProc(t, installConfig(t, root, srv), "/bin/sh", "-c", cmd)
	if code := p.wait(t); code != codeOK || !strings.Contains(p.stderr.String(), "nothing to retire") {
		t.Fatalf("retire unit: exit %d\n%s", code, p.stderr)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "pki", "sa.pub")); string(data) != string(pub) {
		t.Fatal("sa.pub changed")
	}
}
