package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

const appTmpl = `db={{getv "/db/host"}}:{{getv "/db/port" "5432"}}
{{range gets "/upstreams/*"}}server {{base .Key}} {{.Value}};
{{end}}{{range lsdir "/services"}}svc {{.}}={{getv (printf "/services/%s/addr" .)}}
{{end}}values={{join (getvs "/upstreams/*") ","}}
`

func putAppKeys(t *testing.T, s *etcdtest.Server) {
	t.Helper()
	for k, v := range map[string]string{
		"/app/db/host":           "db.internal",
		"/app/upstreams/b":       "10.0.0.2",
		"/app/upstreams/a":       "10.0.0.3",
		"/app/services/web/addr": "1.1.1.1",
		"/app/services/api/addr": "2.2.2.2",
		"/appendix/db/host":      "must-not-leak",
		"/app/dbx/host":          "must-not-leak",
	} {
		s.Put(t, k, v)
	}
}

const appWant = `db=db.internal:5432
server a 10.0.0.3;
server b 10.0.0.2;
svc api=2.2.2.2
svc web=1.1.1.1
values=10.0.0.2,10.0.0.3
`

func TestOnetimeRendersFromEtcd(t *testing.T) {
	s := etcdtest.Start(t)
	putAppKeys(t, s)
	c := newConfdir(t)
	dest := c.resource("app", `[template]
src = "app.tmpl"
dest = "DEST"
prefix = "/app"
keys = ["/db", "/upstreams", "/services"]
mode = "0600"
`, appTmpl)
	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)...)
	if r.code != 0 {
		t.Fatalf("exit %d:\n%s", r.code, r.stderr)
	}
	if got := readFile(t, dest); got != appWant {
		t.Errorf("rendered:\n%s\nwant:\n%s", got, appWant)
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %#o, want 0600", fi.Mode().Perm())
	}
	if len(c.stageFiles()) != 0 {
		t.Errorf("stage files left: %v", c.stageFiles())
	}

	// The global -prefix replaces the resource's prefix, as in confd 0.16.
	s.Put(t, "/other/db/host", "other.internal")
	r = confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-prefix", "/other", "-noop", "-noop-show-secrets")...) // the file is 0600
	if r.code != 0 || !strings.Contains(r.stdout, "+db=other.internal:5432") {
		t.Errorf("-prefix /other -noop: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if got := readFile(t, dest); got != appWant {
		t.Errorf("-noop changed the file")
	}
}

func TestOnetimeOverTLS(t *testing.T) {
	s := etcdtest.Start(t, etcdtest.WithTLS())
	s.Put(t, "/app/db/host", "tls.internal")
	c := newConfdir(t)
	dest := c.resource("app", "[template]\nsrc = \"app.tmpl\"\ndest = \"DEST\"\nkeys = [\"/app/db/host\"]\n", `{{getv "/app/db/host"}}`)
	ways := []struct {
		name string
		env  []string
		args []string
	}{
		{"flags", nil, []string{"-client-ca-keys", s.TLS.CA, "-client-cert", s.TLS.ClientCert, "-client-key", s.TLS.ClientKey}},
		{"environment", []string{"CONFD_CLIENT_CAKEYS=" + s.TLS.CA, "CONFD_CLIENT_CERT=" + s.TLS.ClientCert, "CONFD_CLIENT_KEY=" + s.TLS.ClientKey}, nil},
	}
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			os.Remove(dest)
			r := confd(t, w.env, append(append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir), w.args...)...)
			if r.code != 0 || readFileOr(dest) != "tls.internal" {
				t.Fatalf("exit %d, dest %q:\n%s", r.code, readFileOr(dest), r.stderr)
			}
		})
	}
	t.Run("confd.toml", func(t *testing.T) {
		os.Remove(dest)
		cfg := filepath.Join(t.TempDir(), "confd.toml")
		body := fmt.Sprintf("backend = \"etcdv3\"\nnodes = [%q]\nclient_cakeys = %q\nclient_cert = %q\nclient_key = %q\nconfdir = %q\n",
			s.Endpoint, s.TLS.CA, s.TLS.ClientCert, s.TLS.ClientKey, c.Dir)
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		r := confd(t, nil, "-onetime", "-config-file", cfg)
		if r.code != 0 || readFileOr(dest) != "tls.internal" {
			t.Fatalf("exit %d, dest %q:\n%s", r.code, readFileOr(dest), r.stderr)
		}
	})
	t.Run("untrusted client certificate", func(t *testing.T) {
		if err := os.WriteFile(dest, []byte("live"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-dial-timeout", "2s",
			"-client-ca-keys", s.TLS.CA, "-client-cert", s.TLS.UntrustedClientCert, "-client-key", s.TLS.UntrustedClientKey)...)
		if r.code == 0 || !strings.Contains(r.stderr, s.Endpoint) {
			t.Errorf("exit %d; stderr should name the endpoint:\n%s", r.code, r.stderr)
		}
		if readFileOr(dest) != "live" {
			t.Error("live file changed")
		}
	})
}

func readFileOr(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func TestUnreachableEtcdWritesNothing(t *testing.T) {
	c := newConfdir(t)
	dest := c.resource("app", "[template]\nsrc = \"app.tmpl\"\ndest = \"DEST\"\nkeys = [\"/a\"]\n", `{{getv "/a" "x"}}`)
	endpoint := etcdtest.UnusedEndpoint(t)
	// An empty confd.toml: a resource file given as one (as this test
	// did) is now refused for its [template] table before etcd is dialled.
	cfg := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := confd(t, nil, "-onetime", "-backend", "etcdv3", "-node", endpoint, "-confdir", c.Dir, "-dial-timeout", "1s",
		"-config-file", cfg)
	if r.code == 0 {
		t.Fatalf("exit 0 with etcd unreachable:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, endpoint) {
		t.Errorf("error does not name the endpoint %s:\n%s", endpoint, r.stderr)
	}
	if _, err := os.Stat(dest); !os.IsNotExist(err) {
		t.Errorf("dest written although etcd is unreachable")
	}
}

func TestFailuresAreIsolatedAndLoseNothing(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/k/good", "good-value")
	c := newConfdir(t)
	good := c.resource("good", "[template]\nsrc = \"good.tmpl\"\ndest = \"DEST\"\nkeys = [\"/k\"]\n", `{{getv "/k/good"}}`)
	missing := c.resource("missing", "[template]\nsrc = \"missing.tmpl\"\ndest = \"DEST\"\nkeys = [\"/k\"]\n", "line one\n{{getv \"/k/absent\"}}\n")
	checked := c.resource("checked", "[template]\nsrc = \"checked.tmpl\"\ndest = \"DEST\"\nkeys = [\"/k\"]\ncheck_cmd = \"grep -q expected {{.src}}\"\nreload_cmd = \"touch DEST.reloaded\"\n", `{{getv "/k/good"}}`)
	c.resource("broken", "[template]\nsrc = \"broken.tmpl\"\ndest = \n", "")
	c.resource("notemplate", "[template]\nsrc = \"nope.tmpl\"\ndest = \"DEST\"\n", "")
	for _, p := range []string{missing, checked} {
		if err := os.WriteFile(p, []byte("live\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)...)
	if r.code == 0 {
		t.Fatalf("exit 0 although resources failed:\n%s", r.stderr)
	}
	if readFileOr(good) != "good-value" {
		t.Errorf("good resource not rendered: %q", readFileOr(good))
	}
	for _, p := range []string{missing, checked} {
		if readFileOr(p) != "live\n" {
			t.Errorf("%s changed to %q", p, readFileOr(p))
		}
	}
	if _, err := os.Stat(checked + ".reloaded"); err == nil {
		t.Error("reload ran after a failed check")
	}
	if len(c.stageFiles()) != 0 {
		t.Errorf("stage files left: %v", c.stageFiles())
	}
	errorLines := 0
	for _, l := range strings.Split(r.stderr, "\n") {
		if strings.Contains(l, " ERROR ") {
			errorLines++
		}
	}
	if errorLines != 4 {
		t.Errorf("%d ERROR lines, want one per failed resource (4):\n%s", errorLines, r.stderr)
	}
	for _, want := range []string{
		"missing.tmpl:2", "/k/absent", // template, line and key
		"checked.toml", "check_cmd failed",
		"broken.toml:", "nope.tmpl",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

func TestUsernamePassword(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/secure/a", "A")
	s.EnableAuth(t, "rootpw", "reader", "s3cret-pw", "/secure")
	c := newConfdir(t)
	dest := c.resource("app", "[template]\nsrc = \"app.tmpl\"\ndest = \"DEST\"\nkeys = [\"/secure\"]\n", `{{getv "/secure/a"}}`)
	r := confd(t, []string{"CONFD_PASSWORD=s3cret-pw"}, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-username", "reader")...)
	if r.code != 0 || readFileOr(dest) != "A" {
		t.Fatalf("exit %d dest %q:\n%s", r.code, readFileOr(dest), r.stderr)
	}
	r = confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-username", "reader", "-password", "wrong-pw-xyz", "-basic-auth", "-log-level", "debug")...)
	if r.code == 0 {
		t.Fatal("wrong password accepted")
	}
	if strings.Contains(r.stderr, "wrong-pw-xyz") {
		t.Errorf("password in output:\n%s", r.stderr)
	}
}

func TestSingleDashSystemdStyleFlags(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/x/y", "z")
	c := newConfdir(t)
	dest := c.resource("x", "[template]\nsrc = \"x.tmpl\"\ndest = \"DEST\"\nkeys = [\"/x\"]\n", `{{getv "/x/y"}}`)
	cfg := filepath.Join(t.TempDir(), "confd.toml")
	os.WriteFile(cfg, nil, 0o600)
	// The exact spellings of units written for confd 0.16 (Go's flag package).
	r := confd(t, nil, "-onetime=true", "-backend=etcdv3", "-node", s.Endpoint, "-confdir="+c.Dir, "-config-file", cfg, "-log-level=debug", "-watch=false")
	if r.code != 0 || readFileOr(dest) != "z" {
		t.Fatalf("exit %d dest %q:\n%s", r.code, readFileOr(dest), r.stderr)
	}
}
