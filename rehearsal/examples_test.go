package rehearsal

import (
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Nothing in the examples needs etcdctl, and every command of
// kube-apiserver-safe-restart in them reads the one configuration file
// (the check_cmd, which needs no etcd and no setting, aside).
func TestExamplesUseTheConfigFile(t *testing.T) {
	cmd := regexp.MustCompile(`kube-apiserver-safe-restart( [a-z-]+)?`)
	for rel, text := range exampleFiles(t) {
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") {
				continue
			}
			if strings.Contains(line, "etcdctl") || strings.Contains(line, "ETCDCTL_") {
				t.Errorf("%s still needs etcdctl or its environment: %s", rel, line)
			}
			if strings.HasPrefix(rel, "puppet/") || !strings.Contains(line, "/usr/local/bin/kube-apiserver-safe-restart") {
				continue
			}
			if m := cmd.FindStringSubmatch(line); m != nil && m[1] == " check" {
				continue
			}
			if !strings.Contains(line, "--config /etc/kubernetes/safe-restart.toml") {
				t.Errorf("%s: runs the helper without the configuration file: %s", rel, line)
			}
		}
	}
}

// The Puppet class writes the shipped safe-restart.toml with its own etcd
// settings: with the example's, the template gives the example byte for
// byte.
func TestPuppetConfigIsTheExample(t *testing.T) {
	files := exampleFiles(t)
	epp := files["puppet/safe-restart.toml.epp"]
	header, body, ok := strings.Cut(epp, "\n")
	if !ok || !strings.HasPrefix(header, "<%- |") {
		t.Fatalf("safe-restart.toml.epp has no parameter header")
	}
	body = strings.Replace(body, "# Managed by Puppet (sa_key_sync), from examples/safe-restart.toml.\n", "", 1)
	body = strings.NewReplacer(
		`<%= $nodes.map |$n| { "\"${n}\"" }.join(', ') %>`, `"https://127.0.0.1:2379"`,
		`<%= $ca %>`, "/etc/kubernetes/pki/etcd/ca.crt",
		`<%= $cert %>`, "/etc/kubernetes/pki/apiserver-etcd-client.crt",
		`<%= $key %>`, "/etc/kubernetes/pki/apiserver-etcd-client.key").Replace(body)
	if body != files["safe-restart.toml"] {
		t.Errorf("safe-restart.toml.epp with the example's etcd settings:\n%s\nwant examples/safe-restart.toml:\n%s", body, files["safe-restart.toml"])
	}
	if !strings.Contains(files["puppet/sa_key_sync.pp"], "'/etc/kubernetes/safe-restart.toml'") {
		t.Error("sa_key_sync.pp does not write /etc/kubernetes/safe-restart.toml")
	}
}

// The Puppet class ships every example file the rehearsal runs, installs
// both binaries, and enables confd, the publisher and the retire timer;
// the publisher's former path unit is disabled and removed.
func TestPuppetClassShipsAndEnablesEverything(t *testing.T) {
	files := exampleFiles(t)
	pp := files["puppet/sa_key_sync.pp"]
	names := func(dir string) []string {
		var out []string
		for rel := range files {
			if filepath.Dir(rel) == dir {
				out = append(out, filepath.Base(rel))
			}
		}
		sort.Strings(out)
		return out
	}
	for _, dir := range []string{"confd/conf.d", "confd/templates", "systemd", "systemd/kube-apiserver.service.d"} {
		for _, n := range names(dir) {
			if !strings.Contains(pp, "'"+n+"'") {
				t.Errorf("sa_key_sync.pp does not install %s/%s", dir, n)
			}
		}
	}
	for _, want := range []string{
		`"/usr/local/bin/${b}"`, `['confd', 'kube-apiserver-safe-restart']`,
	} {
		if !strings.Contains(pp, want) {
			t.Errorf("sa_key_sync.pp lacks %s", want)
		}
	}
	for _, svc := range []string{"confd", "sa-key-publish.service", "sa-key-retire.timer"} {
		re := regexp.MustCompile(`service \{ '` + regexp.QuoteMeta(svc) + `':[^}]*enable\s*=>\s*true`)
		if !re.MatchString(pp) {
			t.Errorf("sa_key_sync.pp does not enable %s", svc)
		}
	}
	// Every unit Puppet enables can be enabled: it has an [Install] section.
	if !regexp.MustCompile(`service \{ 'sa-key-publish.path':[^}]*enable\s*=>\s*false`).MatchString(pp) ||
		!regexp.MustCompile(`file \{ '/etc/systemd/system/sa-key-publish.path':[^}]*ensure\s*=>\s*absent`).MatchString(pp) {
		t.Error("sa_key_sync.pp does not disable and remove the former sa-key-publish.path")
	}
	for _, u := range []string{"confd.service", "sa-key-publish.service"} {
		if !strings.Contains(files["systemd/"+u], "[Install]\nWantedBy=multi-user.target") {
			t.Errorf("%s has no [Install] WantedBy=multi-user.target", u)
		}
	}
}
