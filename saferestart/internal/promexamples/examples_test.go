package promexamples

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v3"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/internal/toolbin"
	"github.com/keysync/confd/metrics"
	"github.com/keysync/confd/saferestart/internal/fleetstate"
	"github.com/keysync/confd/saferestart/internal/keywatch"
	"github.com/keysync/confd/saferestart/internal/tokenprobe"
	"github.com/keysync/confd/sasigner/signer"
)

const (
	rulesFile     = "kube-apiserver-keys.rules.yaml"
	rulesTestFile = "kube-apiserver-keys.rules.test.yaml"
	dashboardFile = "kube-apiserver-keys.dashboard.json"
)

// alerts are the alert names operators route on (docs/operations.md): the
// rules file has exactly these.
var alerts = []string{
	"KubeAPIServerKeyNotTrusted",
	"KubeAPIServerRestartHold",
	"ConfdReloadOwed",
	"ConfdWatchDown",
	"KubeAPIServerSASignerFetchFailing",
	"KubeAPIServerSupersededKeyPastRetirement",
	"KubeAPIServerKeyRotationStuck",
	"KubeAPIServerStaleTokensGrowing",
	"KubeAPIServerTokenNotAccepted",
	"KubeAPIServerKeyStateUnreadable",
}

// pending: metrics a query may name that are exported on a branch not
// merged yet (none now); TestPendingNotExported fails for any name on it
// that the gathered registries export.
var pending []string

// publisherCollectors are what publish-key --watch registers on its
// --publisher-metrics-addr. Each must be collectable without etcd: give a
// collector that reads at scrape time a read that fails, e.g.
// &fleetstate.Collector{Read: func(context.Context) (*fleetstate.Snapshot, error) { return nil, errors.New("no etcd here") }},
// and a prober that registers itself its own registry (Prober.Register).
func publisherCollectors(t *testing.T) []prometheus.Collector {
	return []prometheus.Collector{keywatch.NewMetrics().Registry,
		&fleetstate.Collector{Read: func(context.Context) (*fleetstate.Snapshot, error) { return nil, errors.New("no etcd here") },
			Log: logrus.New()},
		tokenProbeRegistry(t)}
}

// tokenProbeRegistry holds the token probe's metrics, as publish-key
// --watch registers them with --token-probe-kubeconfig (New makes no
// request).
func tokenProbeRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:6443\"}\n"+
		"contexts:\n- name: x\n  context: {cluster: c}\ncurrent-context: x\n"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tokenprobe.New(tokenprobe.Config{Host: "m1", Kubeconfig: kc, ServiceAccount: tokenprobe.DefaultServiceAccount})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := p.Register(reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

func examplesDir() string { return filepath.Join(toolbin.RepoRoot(), "examples", "prometheus") }

// promtool checks the rules (syntax, templates, lint) and runs their unit
// tests, as an operator would before loading them; and it parses the
// dashboard's queries, written as recording rules for the check, with
// Grafana's interval variables replaced by a duration.
func TestPromtool(t *testing.T) {
	promtool := toolbin.Promtool(t)
	queries, err := dashboardQueries(filepath.Join(examplesDir(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	grafanaVars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")
	for i, where := range slices.Sorted(maps.Keys(queries)) {
		expr, err := json.Marshal(grafanaVars.Replace(queries[where])) // a JSON string is a YAML string
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "      # %s\n      - record: dashboard:query%d\n        expr: %s\n", where, i, expr)
	}
	dashRules := filepath.Join(t.TempDir(), "dashboard-queries.rules.yaml")
	if err := os.WriteFile(dashRules, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}, {"check", "rules", dashRules}} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = examplesDir()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("cd examples/prometheus && %s %s: %v\n%s", promtool, strings.Join(args, " "), err, out)
			if args[2] == dashRules {
				t.Logf("%s, each query after the panel it is from:\n%s", dashRules, rules.String())
			}
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert, Record, Expr, For string
			Labels, Annotations      map[string]string
		}
	}
}

type ruleTestFile struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name        string
		InputSeries []struct {
			Series string
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			Alertname string
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	}
}

func readYAML(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(examplesDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("examples/prometheus/%s: %v", name, err)
	}
}

// Each alert named in the docs exists once, with a severity and the
// annotations that tell the operator what to run; the unit tests have, for
// each, a case where it fires and one where it must not.
func TestRulesAlertsAndTheirTests(t *testing.T) {
	var rf ruleFile
	readYAML(t, rulesFile, &rf)
	var got []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			got = append(got, r.Alert)
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity label %q, want critical, warning or info", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary annotation", r.Alert)
			}
			d := r.Annotations["description"]
			if !strings.Contains(d, "`kube-apiserver-safe-restart ") && !strings.Contains(d, "`systemctl ") {
				t.Errorf("%s: the description names no command to run next (`kube-apiserver-safe-restart …` or `systemctl …`): %q", r.Alert, d)
			}
		}
	}
	if len(rf.Groups) != 1 {
		t.Errorf("%s: %d groups, want one", rulesFile, len(rf.Groups))
	}
	if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(alerts))) {
		t.Errorf("%s: alerts %q, want %q", rulesFile, got, alerts)
	}

	var tf ruleTestFile
	readYAML(t, rulesTestFile, &tf)
	if !slices.Equal(tf.RuleFiles, []string{rulesFile}) {
		t.Errorf("%s tests rule files %q, want [%s]", rulesTestFile, tf.RuleFiles, rulesFile)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, a := range alerts {
		if !fires[a] {
			t.Errorf("%s: no case where %s fires", rulesTestFile, a)
		}
		if !quiet[a] {
			t.Errorf("%s: no case where %s must not fire", rulesTestFile, a)
		}
	}
}

// The rules, their tests' input series and the dashboard name only metrics
// the binaries export.
func TestQueriesNameExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	queries := map[string]string{}
	var rf ruleFile
	readYAML(t, rulesFile, &rf)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			queries[rulesFile+": "+r.Alert+r.Record] = r.Expr
		}
	}
	var tf ruleTestFile
	readYAML(t, rulesTestFile, &tf)
	for _, tc := range tf.Tests {
		for i, s := range tc.InputSeries {
			queries[fmt.Sprintf("%s: test %q input series %d", rulesTestFile, tc.Name, i+1)] = s.Series
		}
	}
	dq, err := dashboardQueries(filepath.Join(examplesDir(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(dq) < 20 {
		t.Errorf("%s: only %d queries found: the walk of the JSON is broken", dashboardFile, len(dq))
	}
	maps.Copy(queries, dq)
	for _, e := range unknownMetrics(queries, exported) {
		t.Error(e)
	}
}

// The checker itself: a dashboard query naming a metric nobody exports is
// reported, with where it is.
func TestUnknownMetricReported(t *testing.T) {
	queries, err := dashboardQueries(filepath.Join("testdata", "unknown-metric.dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	errs := unknownMetrics(queries, exportedMetrics(t))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `panel "misspelt"`) ||
		!strings.Contains(errs[0].Error(), "kube_apiserver_sa_signer_fetchkeys_total") {
		t.Errorf("unknownMetrics on the misspelt fixture = %v, want one error naming panel \"misspelt\" and kube_apiserver_sa_signer_fetchkeys_total", errs)
	}
}

// The pending list holds only what is not exported yet: once the branches
// adding those metrics are merged and their collectors gathered here, each
// name must leave it, so that the check runs against the registries alone.
func TestPendingNotExported(t *testing.T) {
	exported := exportedMetrics(t)
	for _, name := range pending {
		if exported[name] {
			t.Errorf("%s is exported now: delete it from pending", name)
		}
	}
}

// The dashboard's data source is its template variable, so that it imports
// into any Grafana with a Prometheus data source of any name.
func TestDashboardDataSource(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(examplesDir(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct{ Name, Type, Query string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Errorf("%s: no template variable datasource of type datasource (prometheus)", dashboardFile)
	}
	for _, m := range regexp.MustCompile(`"uid":\s*"([^"]*)"`).FindAllSubmatch(b, -1) {
		if u := string(m[1]); u != "${datasource}" && u != "kube-apiserver-sa-keys" {
			t.Errorf("%s: data source uid %q, want ${datasource}", dashboardFile, u)
		}
	}
}

// exportedMetrics gathers the names of every series the three binaries'
// registries export: confd's metrics.New, the signer's NewMetrics and the
// publisher's collectors. A histogram exports NAME_bucket, NAME_sum and
// NAME_count, not NAME.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	histograms := map[string]bool{}
	add := func(fams map[string]*dto.MetricFamily) {
		for name, f := range fams {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				histograms[name] = true
				names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
			case dto.MetricType_SUMMARY:
				names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
			default:
				names[name] = true
			}
		}
	}

	// confd keeps its registry to itself: its /metrics after a pass of each
	// kind shows every family, the vectors' too.
	m := metrics.New()
	m.Processed("a.toml", apply.Result{Changed: true, Reloaded: true}, nil, false)
	m.Processed("a.toml", apply.Result{Changed: true}, errors.New("reload failed"), true)
	m.Snapshot(true)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("confd's /metrics: %v", err)
	}
	add(fams)

	// The helpers' collectors describe every metric, a vector without a
	// series yet too; gathering tells the histograms.
	for _, c := range append(publisherCollectors(t), signer.NewMetrics().Registry) {
		ch := make(chan *prometheus.Desc)
		go func() {
			c.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			if m := descName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		gathered, err := reg.Gather()
		if err != nil {
			t.Fatalf("gathering the helpers' metrics: %v", err)
		}
		fams := map[string]*dto.MetricFamily{}
		for _, f := range gathered {
			fams[f.GetName()] = f
		}
		add(fams)
	}
	for h := range histograms {
		delete(names, h)
	}
	if !names["confd_watch_up"] || !names["kube_apiserver_sa_signer_etcd_up"] || !names["kube_apiserver_safe_restart_publisher_errors_total"] {
		t.Fatalf("the gathered metrics lack one binary's: %v", slices.Sorted(maps.Keys(names)))
	}
	return names
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// unknownMetrics returns an error for each metric a query names that is
// neither exported nor pending; queries maps where each is to its text.
func unknownMetrics(queries map[string]string, exported map[string]bool) []error {
	var errs []error
	for _, where := range slices.Sorted(maps.Keys(queries)) {
		names, err := metricNames(queries[where])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		for _, n := range names {
			if !exported[n] && !slices.Contains(pending, n) {
				errs = append(errs, fmt.Errorf("%s: metric %s is exported by none of confd, kube-apiserver-sa-signer and publish-key --watch (query %q)", where, n, queries[where]))
			}
		}
	}
	return errs
}

// dashboardQueries returns every "expr" of a Grafana dashboard, nested rows'
// panels included, keyed by the file, the panel's title and the target's
// refId.
func dashboardQueries(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]string{}
	var walk func(v any, panel string)
	walk = func(v any, panel string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				panel = title
			}
			if expr, ok := v["expr"].(string); ok {
				ref, _ := v["refId"].(string)
				out[fmt.Sprintf("%s: panel %q query %s", filepath.Base(path), panel, ref)] = expr
			}
			for _, k := range slices.Sorted(maps.Keys(v)) {
				walk(v[k], panel)
			}
		case []any:
			for _, e := range v {
				walk(e, panel)
			}
		}
	}
	walk(d, "")
	return out, nil
}
