package saferestart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/fqdn"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
)

// The shipped timeouts are above the worst case of the commands they bound,
// with the flags the examples give them: confd kills a reload_cmd at its
// reload_cmd_timeout and systemd a start at TimeoutStartSec, either of
// which cuts a restart short in the middle (a hold, and a line stopped
// for nothing).
func TestExampleTimeoutsCoverTheWorstCase(t *testing.T) {
	// Each set of examples is installed on its own kind of master: a
	// binary-deployed one (examples/confd, examples/systemd) or a kubeadm
	// one (examples/kubeadm), so each is checked against its own commands.
	for _, set := range []struct {
		name, conf       string // conf: the set's safe-restart.toml
		resources, units []string
	}{
		{"systemd", "../examples/safe-restart.toml", []string{"../examples/confd/conf.d/*.toml"}, []string{"../examples/systemd/*.service", "../examples/systemd/*.d/*.conf"}},
		{"kubeadm", "../examples/kubeadm/safe-restart.toml", []string{"../examples/kubeadm/confd/conf.d/*.toml"}, []string{"../examples/kubeadm/systemd/*.service", "../examples/kubeadm/systemd/*.d/*.conf"}},
	} {
		t.Run(set.name, func(t *testing.T) {
			checkExampleTimeouts(t, set.conf, globs(t, set.resources...), globs(t, set.units...))
		})
	}
}

func checkExampleTimeouts(t *testing.T, conf string, resources, units []string) {
	if len(resources) == 0 || len(units) == 0 {
		t.Fatalf("no example found: %d resources, %d units", len(resources), len(units))
	}
	// What confd may spend on one pass over every resource (its start,
	// which waits for the first render), and on the longest reload (its
	// stop, which lets a running reload finish).
	var confdPass, longestReload time.Duration
	checked := 0
	for _, path := range resources {
		var r struct {
			Template struct {
				CheckCmd         string `toml:"check_cmd"`
				CheckCmdTimeout  string `toml:"check_cmd_timeout"`
				ReloadCmd        string `toml:"reload_cmd"`
				ReloadCmdTimeout string `toml:"reload_cmd_timeout"`
			} `toml:"template"`
		}
		if _, err := toml.DecodeFile(path, &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		tmpl := r.Template
		for _, c := range []struct{ cmd, timeout, key string }{
			{tmpl.CheckCmd, tmpl.CheckCmdTimeout, "check_cmd_timeout"},
			{tmpl.ReloadCmd, tmpl.ReloadCmdTimeout, "reload_cmd_timeout"},
		} {
			if c.cmd == "" {
				continue
			}
			limit, err := time.ParseDuration(c.timeout)
			if err != nil {
				t.Fatalf("%s: %s %q: %v", path, c.key, c.timeout, err)
			}
			confdPass += limit
			if c.key == "reload_cmd_timeout" {
				longestReload = max(longestReload, limit)
			}
			worst, ok := commandWorstCase(t, conf, path, c.cmd)
			if !ok {
				continue
			}
			checked++
			if limit < worst {
				t.Errorf("%s: %s = %s is below the worst case of %q: %s", path, c.key, limit, c.cmd, worst)
			}
		}
	}
	for _, path := range units {
		u := readUnit(t, path)
		var start time.Duration
		for _, key := range []string{"ExecStartPre", "ExecStart"} {
			for _, cmd := range u[key] {
				if strings.Contains(cmd, "/confd ") {
					start += confdPass
					stop, ok := systemdTime(t, path, u, "TimeoutStopSec")
					if !ok || stop < longestReload {
						t.Errorf("%s: TimeoutStopSec %s is below the longest reload_cmd_timeout %s: a stop would kill a running restart", path, stop, longestReload)
					}
					checked++
					continue
				}
				if worst, ok := commandWorstCase(t, conf, path, cmd); ok {
					start += worst
					checked++
				}
			}
		}
		if start == 0 {
			continue
		}
		limit, ok := systemdTime(t, path, u, "TimeoutStartSec")
		switch {
		case !ok && slices.Contains(u["Type"], "oneshot"):
			// systemd does not time out a oneshot's start by default.
		case !ok:
			t.Errorf("%s: no TimeoutStartSec (systemd's default is 90 s), and its commands may take %s", path, start)
		case limit < start:
			t.Errorf("%s: TimeoutStartSec %s is below the worst case of its commands: %s", path, limit, start)
		}
	}
	if checked < 3 {
		t.Fatalf("only %d commands checked: the examples' layout changed under this test", checked)
	}
}

func globs(t *testing.T, patterns ...string) []string {
	t.Helper()
	var out []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// commandWorstCase is the worst case of a command line that runs this
// binary, with its flags; false for other commands. Template actions and
// $VARIABLES (site overrides, empty in the examples) are left out.
func commandWorstCase(t *testing.T, conf, where, cmdline string) (time.Duration, bool) {
	t.Helper()
	words := strings.Fields(strings.NewReplacer("'", " ", `"`, " ", ";", " ").Replace(cmdline))
	at := -1
	for i, w := range words {
		if filepath.Base(w) == cmdkit.ProgName {
			at = i
			break
		}
	}
	if at < 0 {
		return 0, false
	}
	var args []string
	for _, w := range words[at+1:] {
		if strings.HasPrefix(w, "$") {
			continue
		}
		if strings.Contains(w, "{{") {
			w = "/example/file"
		}
		if w == config.DefaultPath {
			w = conf // the shipped configuration of this kind of master
		}
		args = append(args, w)
	}
	o, _, err := parseArgs(args, env(nil))
	if err != nil {
		t.Fatalf("%s: %q: %v", where, cmdline, err)
	}
	waits := o.DialTimeout // every subcommand but check connects first
	switch c := o.opts.(type) {
	case *restartcmd.Command:
		return restartcmd.WorstCase(&c.Restarting, &o.Etcd), true
	case *keycmd.RotateKey:
		return restartcmd.WorstCase(&c.Restarting, &o.Etcd), true
	case *keycmd.WaitTrusted:
		if c.HostName == "" && c.IfNewKey {
			waits += fqdn.Timeout
		}
		return waits + o.CommandTimeout + c.Timeout, true // read the trust records, then wait
	case *checkCmd:
		if c.RequireSigningKeys {
			return waits + o.CommandTimeout, true // connect, read the trust records
		}
		return 0, true // reads local files: no wait
	case *keycmd.RetireKeys:
		if c.HostName == "" {
			waits += fqdn.Timeout
		}
		// the rotation claim, waited for up to a lease, then a few requests
		return waits + time.Duration(cmdkit.ClaimTTL+2)*time.Second + 5*o.CommandTimeout, true
	default:
		return waits + 2*o.CommandTimeout, true
	}
}

// readUnit returns a systemd unit's settings, continuation lines joined.
func readUnit(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if ok {
			out[k] = append(out[k], v)
		}
	}
	return out
}

var systemdSpan = regexp.MustCompile(`^(\d+)\s*(h|hr|hours?|min|minutes?|m|s|sec|seconds?|ms)?$`)

// systemdTime parses a unit's time setting as systemd.time(7) does for the
// forms the examples use ("45min", "1h 30min", "90", "90s").
func systemdTime(t *testing.T, where string, u map[string][]string, key string) (time.Duration, bool) {
	t.Helper()
	vals := u[key]
	if len(vals) == 0 {
		return 0, false
	}
	v := strings.TrimSpace(vals[len(vals)-1])
	if v == "infinity" {
		return 1 << 62, true
	}
	var total time.Duration
	for _, part := range strings.Fields(v) {
		m := systemdSpan.FindStringSubmatch(part)
		if m == nil {
			t.Fatalf("%s: %s=%s: not a time span this test reads", where, key, v)
		}
		n, _ := strconv.Atoi(m[1])
		unit := map[string]time.Duration{"": time.Second, "s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
			"ms": time.Millisecond, "m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
			"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour}[m[2]]
		total += time.Duration(n) * unit
	}
	return total, true
}

// Puppet's exec of `systemctl start UNIT` waits for the unit's start: its
// timeout (Puppet's default is 300 s) must be above the unit's
// TimeoutStartSec, or Puppet reports a failure while the restart goes on.
func TestExamplePuppetExecTimeouts(t *testing.T) {
	manifests := globs(t, "../examples/puppet/*.pp", "../examples/*/puppet/*.pp")
	execs := regexp.MustCompile(`(?s)exec \{[^}]*?command\s*=>\s*'/bin/systemctl start ([^']+\.service)'[^}]*?\}`)
	timeout := regexp.MustCompile(`timeout\s*=>\s*(\d+)`)
	checked := 0
	for _, path := range manifests {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range execs.FindAllStringSubmatch(string(data), -1) {
			units := globs(t, "../examples/systemd/"+m[1], "../examples/*/systemd/"+m[1])
			if len(units) == 0 {
				continue
			}
			limit, ok := systemdTime(t, units[0], readUnit(t, units[0]), "TimeoutStartSec")
			if !ok {
				continue
			}
			wait := 300 * time.Second // Puppet's default exec timeout
			if tm := timeout.FindStringSubmatch(m[0]); tm != nil {
				n, _ := strconv.Atoi(tm[1])
				wait = time.Duration(n) * time.Second
			}
			checked++
			if wait <= limit {
				t.Errorf("%s: exec of %s times out after %s, not above its TimeoutStartSec %s", path, m[1], wait, limit)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no Puppet exec of a unit with TimeoutStartSec found")
	}
}
