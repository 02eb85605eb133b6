package fqdn

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// fakeHostname puts a `hostname` running script first on PATH.
func fakeHostname(t *testing.T, script string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hostname"), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func TestLookup(t *testing.T) {
	for _, c := range []struct {
		name, script, want string
		warns              bool
	}{
		{"fqdn", `[ "$1" = -f ] && echo ' m1.example.com '`, "m1.example.com", false},
		{"fails", "exit 1", "m1", true},
		{"prints nothing", "exit 0", "m1", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fakeHostname(t, c.script)
			var logs bytes.Buffer
			log := logrus.New()
			log.SetOutput(&logs)
			if got := Lookup(context.Background(), log, "m1"); got != c.want {
				t.Errorf("Lookup = %q, want %q", got, c.want)
			}
			if warned := strings.Contains(logs.String(), `using \"m1\" as this host's name`); warned != c.warns {
				t.Errorf("warned %v, want %v: %s", warned, c.warns, logs.String())
			}
		})
	}
}
