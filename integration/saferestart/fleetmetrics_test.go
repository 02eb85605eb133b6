package saferestart

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/trust"
)

// fleetMetricNames are the fleet gauges every publisher exports.
var fleetMetricNames = []string{
	"kube_apiserver_safe_restart_published_keys",
	"kube_apiserver_safe_restart_superseded_keys",
	"kube_apiserver_safe_restart_key_retirement_due_seconds",
	"kube_apiserver_safe_restart_untrusted_keys",
	"kube_apiserver_safe_restart_last_restart_timestamp_seconds",
	"kube_apiserver_safe_restart_hold_active",
	"kube_apiserver_safe_restart_lock_held",
	"kube_apiserver_safe_restart_lock_holder_age_seconds",
	"kube_apiserver_safe_restart_lock_holder_info",
	"kube_apiserver_safe_restart_rotation_phase",
	"kube_apiserver_safe_restart_rotation_phase_age_seconds",
	"kube_apiserver_safe_restart_stale_tokens",
	"kube_apiserver_safe_restart_fleet_state_up",
	"kube_apiserver_safe_restart_fleet_state_timestamp_seconds",
}

// publish-key --watch exports the fleet's state read from etcd at each
// scrape: with a trust record, a rotation record, a stale-token record, a
// forgotten host's superseded key and an etcdctl lock holder in etcd,
// every fleet gauge is there; a hold the helper's `hold` writes shows at
// the next scrape.
func TestPublishWatchFleetMetrics(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	now := time.Now().UTC()
	m1, m2 := newKeyHost(t, "m1"), newKeyHost(t, "m2")

	rec, err := json.Marshal(trust.Record{Host: "m1", Trusted: []string{m1.kid}, Time: now})
	if err != nil {
		t.Fatal(err)
	}
	st, err := json.Marshal(staletokens.Record{Host: "m1", LastSample: now, Counter: 3})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		trust.Key(trustPrefix, "m1"):          string(rec),
		rotationPrefix + "/m1/state":          fmt.Sprintf(`{"host":"m1","phase":"installed","updated":%q}`, now.Format(time.RFC3339)),
		staletokens.Key(rotationPrefix, "m1"): string(st),
	} {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	// m2 was forgotten: its key stays published, superseded, for an hour.
	items, err := keystate.ParseValue("m2", m2.pub, false)
	if err != nil {
		t.Fatal(err)
	}
	store := &keystate.Store{KV: cli, KeysPrefix: keysPrefix, RecordPrefix: rotationPrefix}
	if _, err := store.Update(ctx, "m2", func(s keystate.State) (keystate.State, error) {
		s, _, err := s.Publish(items, "test", now, 0)
		return s.Forget("test", now, time.Hour), err
	}); err != nil {
		t.Fatal(err)
	}
	g := newGate(t, t.TempDir(), "holder")
	ctl := etcdctl(t, env(srv), "lock", "kube-apiserver-restart", "--", "sh", "-c", g.script())
	g.awaitReady(t)

	addr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	publishWatch(t, srv, m1, "--publisher-metrics-addr", addr)
	m := metricsText(t, addr)
	for _, name := range fleetMetricNames {
		if !strings.Contains(m, "\n"+name+" ") && !strings.Contains(m, "\n"+name+"{") {
			t.Errorf("%s missing", name)
		}
	}
	for _, want := range []string{
		"kube_apiserver_safe_restart_hold_active 0",
		"kube_apiserver_safe_restart_fleet_state_up 1",
		"kube_apiserver_safe_restart_lock_held 1",
		`kube_apiserver_safe_restart_lock_holder_info{host="unknown"} 1`,
		`kube_apiserver_safe_restart_published_keys{host="m1"} 1`,
		`kube_apiserver_safe_restart_superseded_keys{host="m2"} 1`,
		`kube_apiserver_safe_restart_untrusted_keys{host="m1"} 1`, // m2's key
		`kube_apiserver_safe_restart_untrusted_keys{host="m2"} 0`, // forgotten: must trust nothing
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="installed"} 1`,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="none"} 1`,
		`kube_apiserver_safe_restart_stale_tokens{host="m1"} 3`,
		`kube_apiserver_safe_restart_publisher_errors_total{kind="fleet-state"} 0`,
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, strings.SplitN(want, "{", 2)[0]))
		}
	}
	if strings.Contains(m, "kube_apiserver_safe_restart_hold_info{") {
		t.Errorf("hold_info without a hold:\n%s", grepLines(m, "hold_info"))
	}
	g.release(t)
	ctl.wait(t)

	// The collector reads etcd at the scrape: once `hold` has written the
	// hold, the next scrape shows it.
	if p := runBin(t, env(srv), "hold", "--reason", "maintenance window"); p.code != codeOK {
		t.Fatalf("hold exited %d", p.code)
	}
	resp, err := cli.Get(ctx, "kube-apiserver-restart-hold")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("no hold record: %v", err)
	}
	var h struct{ Host string }
	if err := json.Unmarshal(resp.Kvs[0].Value, &h); err != nil || h.Host == "" {
		t.Fatalf("hold record %s: %v", resp.Kvs[0].Value, err)
	}
	m = metricsText(t, addr)
	for _, want := range []string{
		"kube_apiserver_safe_restart_hold_active 1",
		fmt.Sprintf(`kube_apiserver_safe_restart_hold_info{host=%q} 1`, h.Host),
		"kube_apiserver_safe_restart_lock_held 0",
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("after hold: metrics lack %s:\n%s", want, grepLines(m, "kube_apiserver_safe_restart_hold"))
		}
	}
}

// restart --metrics-textfile records each run's exit code for
// node_exporter: 0, then 6 for a failed command; the file keeps one
// sample per metric and command.
func TestRestartMetricsTextfile(t *testing.T) {
	srv := etcdtest.Start(t)
	file := filepath.Join(t.TempDir(), "safe-restart.prom")
	if p := runBin(t, env(srv), lockArgs("textfile", "--metrics-textfile", file, "--", "true")...); p.code != codeOK {
		t.Fatalf("restart exited %d", p.code)
	}
	if b, err := os.ReadFile(file); err != nil || !strings.Contains(string(b), `kube_apiserver_safe_restart_last_run_exit_code{command="restart"} 0`+"\n") {
		t.Fatalf("after a restart: %s %v", b, err)
	}
	if p := runBin(t, env(srv), lockArgs("textfile", "--metrics-textfile", file, "--", "false")...); p.code != codeRestart {
		t.Fatalf("failed restart exited %d, want %d", p.code, codeRestart)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `kube_apiserver_safe_restart_last_run_exit_code{command="restart"} 6`+"\n") ||
		strings.Count(string(b), `{command="restart"}`) != 2 ||
		!strings.Contains(string(b), `kube_apiserver_safe_restart_last_run_timestamp_seconds{command="restart"} `) {
		t.Errorf("after a failed restart:\n%s", b)
	}
}
