package docrun

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/etcdtest"
)

func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(etcdtest.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// longFlags are the long flag names a --help output lists.
func longFlags(help string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

// helperCommands are the subcommands the helper's --help lists, less
// cobra's own.
func helperCommands(t *testing.T) []string {
	t.Helper()
	_, help, _ := run(t, helperBin, "--help")
	i := strings.Index(help, "Available Commands:")
	if i < 0 {
		t.Fatalf("%s --help lists no commands:\n%s", helperBin, help)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z-]+) `).FindAllStringSubmatch(help[i:], -1) {
		if m[1] != "help" && m[1] != "completion" {
			out = append(out, m[1])
		}
	}
	return out
}

// Every long flag of the helpers is a key of their one configuration file
// (or one of the few command-line-only choices), and every long flag of
// confd a confd.toml key, so that a unit, a reload_cmd and Puppet can say
// each setting once in a file.
func TestEveryLongFlagIsAConfigKey(t *testing.T) {
	checked := 0
	helperFlag := func(where, help string) {
		for _, f := range longFlags(help) {
			checked++
			if _, ok := config.Lookup(f); !ok && !slices.Contains(config.CommandLineOnly, f) {
				t.Errorf("%s: --%s is no configuration key (internal/config.Keys) and not command-line-only", where, f)
			}
		}
	}
	for _, c := range helperCommands(t) {
		_, help, _ := run(t, helperBin, c, "--help")
		helperFlag(helperBin+" "+c, help)
	}
	_, help, _ := run(t, signerBin, "--help")
	helperFlag(signerBin, help)

	// confd: each flag written in a confd.toml, as its own name with
	// underscores (or confd 0.16's spelling), is no unknown key.
	confd016 := map[string]string{"node": "nodes", "client-ca-keys": "client_cakeys"}
	confdOnly := []string{"help", "version", "config-file", "confdir", "check-config", "validate", "mock-data", "resource"}
	_, help, _ = run(t, confdBin, "--help")
	values := map[string]string{"string": `"x"`, "duration": `"1s"`, "int": "1", "strings": `["x"]`, "stringArray": `["x"]`, "MIN[:MAX]": `"1s"`}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "conf.d", ".keep"), "")
	confdChecked := 0
	for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)(\[=true\|false\]| (\S+))`).FindAllStringSubmatch(help, -1) {
		name := m[1]
		if slices.Contains(confdOnly, name) {
			continue
		}
		key := strings.ReplaceAll(name, "-", "_")
		if k, ok := confd016[name]; ok {
			key = k
		}
		v := "true"
		if m[3] != "" {
			v = values[m[3]]
		}
		path := filepath.Join(dir, "confd.toml")
		writeFile(t, path, key+" = "+v+"\n")
		_, out, errs := run(t, confdBin, "-check-config", "-confdir", dir, "-config-file", path)
		if strings.Contains(out+errs, "unknown key") {
			t.Errorf("confd -%s is no confd.toml key (tried %s): %s", name, key, strings.TrimSpace(out+errs))
		}
		confdChecked++
	}
	if checked < 60 || confdChecked < 30 {
		t.Fatalf("only %d helper and %d confd flags found: --help's layout changed under this test", checked, confdChecked)
	}
}

// The signer's metrics-addr in the one configuration file is read by the
// signer and skipped by kube-apiserver-safe-restart, which has no such flag
// (both exited 2 with "unknown key" once).
func TestMetricsAddrIsAKeyOfBothHelpers(t *testing.T) {
	checkHelperConfig(t, tomlSnippet{where: "metrics-addr", name: "safe-restart.toml", data: "metrics-addr = \"127.0.0.1:9102\"\n"})
	path := filepath.Join(t.TempDir(), "safe-restart.toml")
	writeFile(t, path, "metrics-addr = \"127.0.0.1:9102\"\n")
	if _, out, _ := run(t, helperBin, "config", "--config", path); !strings.Contains(out, `# metrics-addr = "127.0.0.1:9102"`) {
		t.Errorf("%s config does not show metrics-addr as a key it does not read:\n%s", helperBin, out)
	}
}

// docs/safe-restart.md's list of subcommands names every subcommand the
// helper has (publish-key and config were missing).
func TestSafeRestartPageListsEverySubcommand(t *testing.T) {
	page := readDoc(t, "docs/safe-restart.md")
	_, block, ok := strings.Cut(page, "## Subcommands\n\n```\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok {
		t.Fatal("docs/safe-restart.md has no ## Subcommands block")
	}
	cmds := helperCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("only %d subcommands in --help: %v", len(cmds), cmds)
	}
	for _, c := range cmds {
		if c != "restart" && !strings.Contains(block, helperBin+" "+c+" ") && !strings.Contains(block, helperBin+" "+c+"\n") {
			t.Errorf("docs/safe-restart.md's Subcommands lack %s", c)
		}
	}
}

// Every `go build` of a binary in the README and docs builds it static,
// with CGO_ENABLED=0, as `make build` does (docs/safe-restart.md's did
// not).
func TestDocBuildsAreStatic(t *testing.T) {
	if !strings.Contains(readDoc(t, "Makefile"), "CGO_ENABLED=0") {
		t.Fatal("the Makefile no longer builds with CGO_ENABLED=0: update this test")
	}
	root, _, _ := collect(t)
	checked := 0
	for _, f := range docFiles(t, root) {
		for n, line := range strings.Split(readDoc(t, f), "\n") {
			if strings.Contains(line, "go build") && strings.Contains(line, "./cmd/") {
				checked++
				if !strings.Contains(line, "CGO_ENABLED=0 go build") {
					t.Errorf("%s:%d: builds without CGO_ENABLED=0 (make build's static binaries): %s", f, n+1, line)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no go build of a command found in the documents")
	}
}

// The README's set-up of a binary master names each drop-in of
// kube-apiserver.service (the wait-trusted one above all) and each timer
// (the retirement of superseded keys).
func TestReadmeNamesDropInsAndTimers(t *testing.T) {
	root := etcdtest.RepoRoot()
	files, err := filepath.Glob(filepath.Join(root, "examples", "systemd", "kube-apiserver.service.d", "*.conf"))
	if err != nil {
		t.Fatal(err)
	}
	timers, _ := filepath.Glob(filepath.Join(root, "examples", "systemd", "*.timer"))
	files = append(files, timers...)
	if len(files) < 3 {
		t.Fatalf("only %d drop-ins and timers under examples/systemd", len(files))
	}
	readme := readDoc(t, "README.md")
	for _, f := range files {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(filepath.Base(f)) + `\b`).MatchString(readme) {
			t.Errorf("README.md does not name %s", filepath.Base(f))
		}
	}
}

// Every confd.service of the examples serves -metrics-addr on the address
// README.md's health checks use.
func TestExampleConfdUnitsServeMetrics(t *testing.T) {
	m := regexp.MustCompile("run confd with `-metrics-addr ([^`]+)`").FindStringSubmatch(readDoc(t, "README.md"))
	if m == nil {
		t.Fatal("README.md no longer says which -metrics-addr to run confd with")
	}
	root, invs, _ := collect(t)
	units := 0
	for _, inv := range invs {
		if inv.bin != confdBin || !strings.HasPrefix(inv.where, "examples/") || !strings.Contains(inv.where, ".service:") {
			continue
		}
		units++
		if i := slices.Index(inv.args, "-metrics-addr"); i < 0 || i+1 == len(inv.args) || inv.args[i+1] != m[1] {
			t.Errorf("%s: confd runs without -metrics-addr %s (README.md's health checks): %s", inv.where, m[1], inv.text)
		}
	}
	shipped, _ := filepath.Glob(filepath.Join(root, "examples", "*", "confd.service"))
	more, _ := filepath.Glob(filepath.Join(root, "examples", "*", "systemd", "confd.service"))
	if units == 0 || units < len(shipped)+len(more) {
		t.Fatalf("found %d confd command lines in %d confd.service examples", units, len(shipped)+len(more))
	}
}

// docs/kubeadm.md enables only units that a kubeadm master gets
// (scripts/install.sh KIND=kubeadm, or the package's shared units), and
// names the retirement service and timer it relies on.
func TestKubeadmPageInstallsWhatItEnables(t *testing.T) {
	page := readDoc(t, "docs/kubeadm.md")
	install := readDoc(t, "scripts/install.sh")
	for _, want := range []string{"sa-key-retire.service", "sa-key-retire.timer", "sa-key-publish.service"} {
		if !strings.Contains(install, "examples/systemd/"+want) {
			t.Errorf("scripts/install.sh does not install %s", want)
		}
	}
	for _, m := range regexp.MustCompile(`systemctl enable --now ([^\n]+)`).FindAllStringSubmatch(page, -1) {
		for _, u := range strings.Fields(m[1]) {
			if !strings.Contains(u, ".") {
				u += ".service"
			}
			if !strings.Contains(install, "/"+u) {
				t.Errorf("docs/kubeadm.md enables %s, which scripts/install.sh does not install", u)
			}
		}
	}
	if !strings.Contains(page, "sa-key-retire.service") || !strings.Contains(page, "sa-key-retire.timer") {
		t.Error("docs/kubeadm.md does not name sa-key-retire.service and sa-key-retire.timer")
	}
}

// Every template resource of the documents whose reload_cmd runs the
// helper gives it a reload_cmd_timeout (confd's default 10m when none)
// above the worst case the helper itself prints for those flags
// (--dry-run), or confd kills the restart in the middle: operations.md
// once paired it with 10m against about 40 minutes. The examples'
// resources are held to it in package saferestart
// (TestExampleTimeoutsCoverTheWorstCase), with their configuration file.
func TestDocReloadTimeoutsCoverTheWorstCase(t *testing.T) {
	_, _, snippets := collect(t)
	etcd := etcdtest.Start(t)
	checked := 0
	for _, s := range snippets {
		if strings.HasPrefix(s.where, "examples/") {
			continue
		}
		var r struct {
			Template struct {
				ReloadCmd        string `toml:"reload_cmd"`
				ReloadCmdTimeout string `toml:"reload_cmd_timeout"`
			} `toml:"template"`
		}
		data := s.data
		if !strings.Contains(data, "[template]") {
			data = "[template]\n" + data
		}
		if _, err := toml.Decode(data, &r); err != nil || !strings.Contains(r.Template.ReloadCmd, helperBin) {
			continue
		}
		invs := scan(codeCommand, s.where, r.Template.ReloadCmd, 0, r.Template.ReloadCmd)
		if len(invs) != 1 || invs[0].bin != helperBin {
			t.Fatalf("%s: reload_cmd %q: want one command line of %s", s.where, r.Template.ReloadCmd, helperBin)
		}
		limit := 10 * time.Minute // confd's -reload-cmd-timeout
		if r.Template.ReloadCmdTimeout != "" {
			var err error
			if limit, err = time.ParseDuration(r.Template.ReloadCmdTimeout); err != nil {
				t.Fatalf("%s: reload_cmd_timeout: %v", s.where, err)
			}
		}
		// The files the line names (preflight, credentials) change no
		// wait: they are left out, as is any configuration file, so that
		// the dry run's preflight passes on this machine.
		var args []string
		for i := 0; i < len(invs[0].args); i++ {
			a := invs[0].args[i]
			if strings.HasPrefix(a, "--") && !strings.Contains(a, "=") && i+1 < len(invs[0].args) &&
				(strings.HasPrefix(invs[0].args[i+1], "/") || invs[0].args[i+1] == "FILE") {
				i++
				continue
			}
			args = append(args, a)
		}
		// The restart command, which bounds no wait of its own (the
		// --restart-timeout does), is one this machine has.
		args = append(args, "--config", "", "--endpoints", etcd.Endpoint, "--dry-run", "--output", "json", "--", "/bin/true")
		code, out, errs := run(t, helperBin, args...)
		var plan struct {
			WorstCaseSeconds int64 `json:"worst_case_seconds"`
		}
		if err := json.Unmarshal([]byte(out), &plan); code != 0 || err != nil || plan.WorstCaseSeconds == 0 {
			t.Fatalf("%s: %s %q: exit %d, %v:\n%s%s", s.where, helperBin, args, code, err, out, errs)
		}
		checked++
		t.Logf("%s: reload_cmd_timeout %s, worst case %ds", s.where, limit, plan.WorstCaseSeconds)
		if worst := time.Duration(plan.WorstCaseSeconds) * time.Second; limit < worst {
			t.Errorf("%s: reload_cmd_timeout %s is below the worst case %s of its reload_cmd: %s", s.where, limit, worst, invs[0].text)
		}
	}
	if checked < 2 {
		t.Fatalf("only %d resources of the documents run the helper as reload_cmd", checked)
	}
}
