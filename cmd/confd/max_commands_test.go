package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/daemon"
)

// TestMaxCommandsFlag: -max-commands and --max-commands, confd.toml's
// max_commands, the default, and a value that cannot work named.
func TestMaxCommandsFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(file, []byte("max_commands = 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	none := filepath.Join(t.TempDir(), "empty.toml")
	if err := os.WriteFile(none, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"-config-file", none}, daemon.DefaultMaxCommands},
		{[]string{"-config-file", none, "-max-commands", "2"}, 2},
		{[]string{"-config-file", none, "--max-commands=3"}, 3},
		{[]string{"-config-file", file}, 7},
		{[]string{"-config-file", file, "-max-commands=1"}, 1},
	} {
		var out, errb bytes.Buffer
		c, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log == nil || c.MaxCommands != tc.want {
			t.Errorf("configure(%v): exit %d, max commands %v, want %d; stderr %s", tc.args, code, c, tc.want, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if _, log, code := configure([]string{"-config-file", none, "-max-commands", "0"}, &out, &errb, envOf(nil)); log != nil || code != 2 || !strings.Contains(errb.String(), "-max-commands 0") {
		t.Errorf("-max-commands 0: exit %d, stderr %q", code, errb.String())
	}
}
