package rehearsal

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// exampleFiles are every shipped example, by path relative to examples/.
func exampleFiles(t *testing.T) map[string]string {
	t.Helper()
	root := filepath.Join(etcdtest.RepoRoot(), "examples")
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[rel] = string(data)
		return nil
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("read examples: %v (%d files)", err, len(files))
	}
	return files
}

func TestRewriteMovesOnlyHostPathsAndAddresses(t *testing.T) {
	h := Host{Root: "/tmp/fleet/m1", EtcdURL: "https://127.0.0.1:40001", APIServerURL: "https://127.0.0.1:40002", ConfdMetricsAddr: "127.0.0.1:40003"}
	in := `ExecStart=/usr/local/bin/confd -confdir /etc/confd -watch
EnvironmentFile=-/etc/kubernetes/safe-restart.env
ExecStart=/bin/sh -c 'exec /usr/bin/etcdctl put "/kubernetes/service-account-keys/$(hostname -f)" < /etc/kubernetes/pki/sa.pub'
reload_cmd = "/usr/local/bin/kube-apiserver-safe-restart --health-url https://127.0.0.1:6443/readyz --x={{.dest}}"
nodes = ["https://127.0.0.1:2379"]
command => '/bin/systemctl daemon-reload', source => "puppet:///modules/sa_key_sync/conf.d/x"
dest = "/etc/kubernetes/pki/sa-bundle.pem" # not /etcetera, not /usr/local/binx? /usr/bin/etcdctl2 stays
`
	want := `ExecStart=/tmp/fleet/m1/usr/local/bin/confd -confdir /tmp/fleet/m1/etc/confd -watch
EnvironmentFile=-/tmp/fleet/m1/etc/kubernetes/safe-restart.env
ExecStart=/bin/sh -c 'exec /tmp/fleet/m1/usr/bin/etcdctl put "/kubernetes/service-account-keys/$(hostname -f)" < /tmp/fleet/m1/etc/kubernetes/pki/sa.pub'
reload_cmd = "/tmp/fleet/m1/usr/local/bin/kube-apiserver-safe-restart --health-url https://127.0.0.1:40002/readyz --x={{.dest}}"
nodes = ["https://127.0.0.1:40001"]
command => '/tmp/fleet/m1/bin/systemctl daemon-reload', source => "puppet:///modules/sa_key_sync/conf.d/x"
dest = "/tmp/fleet/m1/etc/kubernetes/pki/sa-bundle.pem" # not /etcetera, not /usr/local/binx? /usr/bin/etcdctl2 stays
`
	got := h.Rewrite(in)
	if got != want {
		t.Fatalf("Rewrite:\n got %s\nwant %s", got, want)
	}
	if back := h.Restore(got); back != in {
		t.Fatalf("Restore(Rewrite(x)) != x:\n%s", back)
	}
}

// Every absolute path in every shipped example either moves under the
// host's root or is one of the few shared system paths, and undoing the
// rewrite gives the example back byte for byte: the rehearsal runs the
// examples with nothing but their host paths and addresses changed.
func TestRewriteEveryExample(t *testing.T) {
	h := Host{Root: "/tmp/fleet/m2", EtcdURL: "https://127.0.0.1:40011", APIServerURL: "https://127.0.0.1:40012", ConfdMetricsAddr: "127.0.0.1:40013"}
	abs := regexp.MustCompile(`(?:^|[\s"'=(<-])(/[A-Za-z0-9_.][A-Za-z0-9_./-]*)`)
	// System tools every host shares, and the apiserver's /metrics URL path
	// (RBAC nonResourceURLs, comments): not a file.
	shared := map[string]bool{"/bin/sh": true, "/bin/kill": true, "/metrics": true}
	for name, text := range exampleFiles(t) {
		got := h.Rewrite(text)
		if back := h.Restore(got); back != text {
			t.Errorf("%s: Restore(Rewrite(x)) differs from the example", name)
		}
		if strings.Contains(got, exampleEtcdURL) || strings.Contains(got, exampleAPIServerURL) {
			t.Errorf("%s: a loopback address was not moved", name)
		}
		for _, m := range abs.FindAllStringSubmatch(got, -1) {
			p := m[1]
			switch {
			case strings.HasPrefix(p, h.Root+"/"), shared[p], strings.HasPrefix(p, "/kubernetes/"):
			default:
				t.Errorf("%s: path %s neither moved under the root nor shared", name, p)
			}
		}
	}
}

func TestParseUnitAndCommand(t *testing.T) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "sa.env")
	if err := os.WriteFile(envFile, []byte("# comment\nKUBE_ARGS=\"--a=1 --b=/x y\"\nONE='s p'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unit := `[Unit]
Description=x
ExecStart=/not/this
[Service]
Environment=ETCDCTL_ENDPOINTS=https://e:1 "Q=a b"
EnvironmentFile=-` + filepath.Join(dir, "missing.env") + `
EnvironmentFile=` + envFile + `
ExecStartPre=-/bin/true
ExecStart=/bin/k \
  --flag 'quoted word' \
  $KUBE_ARGS ${ONE} --e=${ONE}
ExecReload=/bin/kill -HUP $MAINPID
Type=notify
Restart=no
Restart=always
RestartSec=1
`
	u, err := ParseUnit("k.service", unit)
	if err != nil {
		t.Fatal(err)
	}
	env, err := u.Env([]string{"PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := []string{"PATH=/bin", "ETCDCTL_ENDPOINTS=https://e:1", "Q=a b", "KUBE_ARGS=--a=1 --b=/x y", "ONE=s p"}
	if strings.Join(env, "|") != strings.Join(wantEnv, "|") {
		t.Fatalf("env = %q, want %q", env, wantEnv)
	}
	argv, ignore, err := Command(u.ExecStart[0], env)
	if err != nil || ignore {
		t.Fatal(err, ignore)
	}
	want := []string{"/bin/k", "--flag", "quoted word", "--a=1", "--b=/x", "y", "s p", "--e=s p"}
	if strings.Join(argv, "|") != strings.Join(want, "|") {
		t.Fatalf("argv = %q, want %q", argv, want)
	}
	if argv, _, _ := Command(u.ExecReload[0], append(env, "MAINPID=42")); strings.Join(argv, " ") != "/bin/kill -HUP 42" {
		t.Fatalf("ExecReload = %q", argv)
	}
	// The last assignment wins, as systemd reads single-valued settings.
	if got := fmt.Sprint(u.Settings); got != "map[Restart:always RestartSec:1 Type:notify]" {
		t.Fatalf("settings = %s", got)
	}
	if _, ignore, _ := Command(u.ExecStartPre[0], env); !ignore {
		t.Fatal("leading - not seen")
	}
	if _, err := ParseUnit("bad.service", "[Service]\nExecStart\n"); err == nil || !strings.Contains(err.Error(), "bad.service:2") {
		t.Fatalf("bad line: %v", err)
	}
	if _, err := u.Env(nil); err != nil {
		t.Fatal(err)
	}
	u.EnvironmentFiles = append(u.EnvironmentFiles, filepath.Join(dir, "required-missing.env"))
	if _, err := u.Env(nil); err == nil {
		t.Fatal("a missing required EnvironmentFile was accepted")
	}
}

// Drop-ins apply in file-name order after the unit: lists append, and an
// empty assignment clears what came before, as systemd does.
func TestLoadUnitDropIns(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("k.service", "[Service]\nEnvironment=A=1\nExecStartPre=/bin/first\nExecStart=/bin/k\n")
	write("k.service.d/20-b.conf", "[Service]\nExecStartPre=\nExecStartPre=/bin/after-reset\nEnvironment=B=2\n")
	write("k.service.d/10-a.conf", "[Service]\nExecStartPre=/bin/dropped\n")
	write("k.service.d/30-c.txt", "[Service]\nExecStartPre=/bin/not-a-drop-in\n")
	u, err := LoadUnit(dir, "k.service")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(u.ExecStartPre, "|"); got != "/bin/after-reset" {
		t.Errorf("ExecStartPre = %q, want only the one after the reset", got)
	}
	if got := strings.Join(u.Environment, "|"); got != "A=1|B=2" {
		t.Errorf("Environment = %q", got)
	}
	write("k.service.d/40-bad.conf", "[Service]\nExecStartPre\n")
	if _, err := LoadUnit(dir, "k.service"); err == nil || !strings.Contains(err.Error(), "40-bad.conf:2") {
		t.Errorf("bad drop-in: %v, want its file and line", err)
	}
}
