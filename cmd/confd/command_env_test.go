package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCommandGraceFlagAndFileKey(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(cfg, []byte("command_grace = \"3s\"\nbackend = \"env\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"-backend", "env"}, 10 * time.Second},
		{[]string{"-config-file", cfg}, 3 * time.Second},
		{[]string{"-config-file", cfg, "-command-grace", "1m"}, time.Minute},
		{[]string{"-config-file", cfg, "--command-grace=2s"}, 2 * time.Second},
	} {
		var out, errb bytes.Buffer
		c, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log == nil || c.CommandGrace != tc.want {
			t.Errorf("configure(%v): exit %d, grace %v, want %v: %s", tc.args, code, c, tc.want, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if _, log, _ := configure([]string{"-backend", "env", "-command-grace", "0s"}, &out, &errb, envOf(nil)); log != nil || !strings.Contains(errb.String(), "-command-grace") {
		t.Errorf("zero grace accepted: %s", errb.String())
	}
}

// Every credential confd reads from the environment stays out of the
// environment of check_cmd and reload_cmd; the rest passes, in order.
func TestCommandEnvDropsCredentials(t *testing.T) {
	for k, v := range map[string]string{"CONFD_PASSWORD": "pw", "CONFD_USERNAME": "u", "CONFD_CLIENT_KEY": "/k.pem", "CONFD_CLIENT_CAKEYS": "/ca.pem"} {
		t.Setenv(k, v)
	}
	got := (&resourceLoader{}).settings(&Config{}).CommandEnv
	var want []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "CONFD_PASSWORD" && k != "CONFD_USERNAME" && k != "CONFD_CLIENT_KEY" {
			want = append(want, kv)
		}
	}
	if !slices.Equal(got, want) || !slices.Contains(got, "CONFD_CLIENT_CAKEYS=/ca.pem") {
		t.Errorf("command env %q, want %q", got, want)
	}
	for _, e := range envKeys {
		if secretFlags[e.flag] || e.flag == "username" || e.flag == "client-key" {
			if slices.ContainsFunc(got, func(kv string) bool { return strings.HasPrefix(kv, e.env+"=") }) {
				t.Errorf("%s reaches commands", e.env)
			}
		}
	}
}
