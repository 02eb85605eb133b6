//go:build rehearsal

package rehearsal

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// reloadBudget: the bundle's reload_cmd, run by the shell as confd runs it
// with --dry-run added, reports the helper's worst case; the resource's
// reload_cmd_timeout (and confd.service's stop timeout) must lie above it,
// with the helper's defaults and with this site's SAFE_RESTART_ARGS, or
// confd would kill a restart that could still succeed.
func (f *fleet) reloadBudget(t *testing.T) {
	h := f.hosts[0]
	var res struct {
		Template struct {
			Dest          string `toml:"dest"`
			ReloadCmd     string `toml:"reload_cmd"`
			ReloadTimeout string `toml:"reload_cmd_timeout"`
		} `toml:"template"`
	}
	if _, err := toml.Decode(string(h.read("/etc/confd/conf.d/20-sa-bundle.toml")), &res); err != nil {
		t.Fatal(err)
	}
	timeout, err := time.ParseDuration(res.Template.ReloadTimeout)
	if err != nil {
		t.Fatalf("reload_cmd_timeout: %v", err)
	}
	u := h.unit(t, "confd.service")
	env, err := u.Env(h.baseEnv())
	if err != nil {
		t.Fatal(err)
	}
	// dest is already under the host's root: the resource file was rewritten.
	cmd := strings.ReplaceAll(res.Template.ReloadCmd, "{{.dest}}", res.Template.Dest) + " --dry-run -o json"
	for _, site := range []string{"defaults", "site"} {
		e := env
		if site == "defaults" {
			e = append(append([]string(nil), env...), "SAFE_RESTART_ARGS=")
		}
		c := exec.Command("/bin/sh", "-c", cmd)
		var stderr strings.Builder
		c.Env, c.Stderr = e, &stderr
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s --dry-run (%s): %v\n%s%s", cmd, site, err, out, stderr.String())
		}
		var plan struct {
			WorstCase        string `json:"worst_case"`
			WorstCaseSeconds int64  `json:"worst_case_seconds"`
		}
		if err := json.Unmarshal(out, &plan); err != nil || plan.WorstCaseSeconds == 0 {
			t.Fatalf("--dry-run -o json (%s) gave no worst case (%v):\n%s", site, err, out)
		}
		worst := time.Duration(plan.WorstCaseSeconds) * time.Second
		t.Logf("%s: helper worst case %s, reload_cmd_timeout %s", site, worst, timeout)
		if worst >= timeout {
			t.Errorf("%s: reload_cmd_timeout %s is not above the helper's worst case %s", site, timeout, worst)
		}
	}
}
