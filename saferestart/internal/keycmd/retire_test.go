package keycmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// parse is a command line of o's flags, checked, with s the shared flags
// (--endpoints defaults to a local etcd).
func parse(t *testing.T, s *cmdkit.Shared, o interface{ Validate(*cmdkit.Shared) []error }, args ...string) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	s.Etcd.Register(fs)
	cmdkit.Register(fs, o)
	if !strings.Contains(strings.Join(args, " "), "--endpoints") {
		args = append([]string{"--endpoints", "127.0.0.1:2379"}, args...)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if errs := o.Validate(s); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// retire-keys refuses (exit 3, names, no token) while a legacy token
// Secret holds a token signed with the retiring key.
func TestLegacyTokenGate(t *testing.T) {
	token := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"OLDKID"}`)) + ".payload.SIGNATURE-NEVER-LOGGED"
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"kind":"SecretList","metadata":{},"items":[{"metadata":{"namespace":"apps","name":"ci-token"},"type":"kubernetes.io/service-account-token","data":{"token":%q}}]}`,
			base64.StdEncoding.EncodeToString([]byte(token)))
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	conf := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q, insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n", srv.URL)
	if err := os.WriteFile(kc, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		kid  string
		want int
	}{
		{[]string{"--kubeconfig", kc}, "OLDKID", cmdkit.ExitPreflight},
		{[]string{"--kubeconfig", kc, "--ignore-legacy-tokens"}, "OLDKID", cmdkit.ExitOK},
		{nil, "OLDKID", cmdkit.ExitOK}, // no kubeconfig: not looked at
		{[]string{"--kubeconfig", kc}, "OTHER", cmdkit.ExitOK},
	} {
		o, s := &RetireKeys{}, &cmdkit.Shared{}
		parse(t, s, o, tt.args...)
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		if got := (&retirer{Env: cmdkit.NewEnv(s, o.HostName, &logs, &logs, log), o: o}).legacyTokenGate(context.Background(), tt.kid, log); got != tt.want {
			t.Errorf("%v: exit %d, want %d:\n%s", tt.args, got, tt.want, logs.String())
		}
		if tt.want == cmdkit.ExitPreflight && !strings.Contains(logs.String(), "apps/ci-token") {
			t.Errorf("the Secret is not named:\n%s", logs.String())
		}
		if strings.Contains(logs.String(), "SIGNATURE-NEVER-LOGGED") || strings.Contains(logs.String(), "payload") {
			t.Errorf("a token reached the log:\n%s", logs.String())
		}
	}
}

// retire-keys refuses (exit 3, naming host and key) while any host's trust
// record says its kube-controller-manager signs with the retiring key, and
// keeps it (exit 0) while any host's apiserver does; records without the
// controller-manager's key (older helpers) block nothing.
func TestRetireRefusedWhileControllerManagerSignsWithIt(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	o, s := &RetireKeys{}, &cmdkit.Shared{}
	parse(t, s, o, "--endpoints", srv.Endpoint, "--host", "m1")
	var logs bytes.Buffer
	log := logrus.New()
	log.Out = &logs
	r := &retirer{Env: cmdkit.NewEnv(s, o.HostName, &logs, &logs, log), o: o}
	record := func(host, signing, cm string) {
		rec := trust.Record{Host: host, Trusted: []string{"OLDKID", "NEWKID"}, Signing: signing, ControllerManagerSigning: cm, Time: time.Now()}
		if err := trust.Put(ctx, cli, trust.DefaultPrefix, "", rec); err != nil {
			t.Fatal(err)
		}
	}
	gates := func() int {
		recs, _, err := trust.List(ctx, cli, trust.DefaultPrefix)
		if err != nil {
			t.Fatal(err)
		}
		_, code := r.retireGates(ctx, "OLDKID", recs, log)
		return code
	}
	// An older helper's record: no controller-manager key.
	srv.Put(t, trust.Key(trust.DefaultPrefix, "m3"), `{"host":"m3","trusted":["OLDKID","NEWKID"],"signing":"NEWKID","bundle_sha256":"x","time":"2026-01-01T00:00:00Z"}`)
	record("m1", "NEWKID", "NEWKID")
	record("m2", "NEWKID", "OLDKID")
	if code := gates(); code != cmdkit.ExitPreflight || !strings.Contains(logs.String(), "m2") || !strings.Contains(logs.String(), "OLDKID") {
		t.Fatalf("m2's controller-manager signs with the retiring key: exit %d, want %d naming m2 and OLDKID:\n%s", code, cmdkit.ExitPreflight, logs.String())
	}
	if strings.Contains(logs.String(), "m1,") || strings.Contains(logs.String(), "m3") {
		t.Errorf("a host named whose controller-manager does not sign with the retiring key:\n%s", logs.String())
	}
	logs.Reset()
	record("m2", "NEWKID", "NEWKID")
	if code := gates(); code != cmdkit.ExitOK {
		t.Fatalf("no controller-manager signs with the retiring key: exit %d:\n%s", code, logs.String())
	}
	// Another host's apiserver signs with the key (a shared key, or a
	// reimaged host not restarted yet): kept, naming it, not an error.
	record("m2", "OLDKID", "NEWKID")
	recs, _, err := trust.List(ctx, cli, trust.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if ok, code := r.retireGates(ctx, "OLDKID", recs, log); ok || code != cmdkit.ExitOK || !strings.Contains(logs.String(), "apiserver on m2 signs with it") {
		t.Fatalf("m2's apiserver signs with the retiring key: retire %v exit %d:\n%s", ok, code, logs.String())
	}
}

// The retire decision as retire-keys takes it: growth within the window,
// over an hour after the key stopped signing, keeps the key (exit 0,
// naming host and time); earlier growth does not; a host without a sample
// is named and does not; --ignore-stale-tokens retires, logging what it
// overrode.
func TestStaleTokenGate(t *testing.T) {
	now := time.Now()
	since := now.Add(-5 * time.Hour)
	grew := func(ago time.Duration) map[string]staletokens.Record {
		return map[string]staletokens.Record{"m1": {Host: "m1", LastGrowth: now.Add(-ago), LastSample: now}}
	}
	for _, tc := range []struct {
		name   string
		args   []string
		recs   map[string]staletokens.Record
		hosts  []string
		retire bool
		logs   []string
	}{
		{"grew within the window after since+1h: refused", nil, grew(10 * time.Minute), []string{"m1"}, false,
			[]string{"level=warning", "stale service-account tokens were used on m1 at " + now.Add(-10*time.Minute).UTC().Format(time.RFC3339), "--ignore-stale-tokens"}},
		{"grew before since+1h: allowed", []string{"--stale-token-window", "24h"}, grew(4*time.Hour + 30*time.Minute), []string{"m1"}, true, nil},
		{"grew before the window: allowed", nil, grew(2 * time.Hour), []string{"m1"}, true, nil},
		{"no sample: unknown, allowed, named", nil, nil, []string{"m1", "m2"}, true, []string{"m1 (never sampled), m2 (never sampled)"}},
		{"--ignore-stale-tokens: allowed, logged", []string{"--ignore-stale-tokens"}, grew(10 * time.Minute), []string{"m1"}, true,
			[]string{"level=warning", "--ignore-stale-tokens: retiring OLDKID although stale service-account tokens were used on m1 at"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, s := &RetireKeys{}, &cmdkit.Shared{}
			parse(t, s, o, tc.args...)
			var logs bytes.Buffer
			log := logrus.New()
			log.Out = &logs
			ok := (&retirer{Env: cmdkit.NewEnv(s, o.HostName, &logs, &logs, log), o: o, stale: tc.recs, hosts: tc.hosts}).staleTokenGate("OLDKID", since, log)
			if ok != tc.retire {
				t.Errorf("retire %v, want %v:\n%s", ok, tc.retire, logs.String())
			}
			for _, s := range tc.logs {
				if !strings.Contains(logs.String(), s) {
					t.Errorf("log lacks %q:\n%s", s, logs.String())
				}
			}
		})
	}
}
