package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchStallTimeoutFlagAndFile: -watch-stall-timeout (either spelling)
// and confd.toml's watch_stall_timeout set the watch's stall timeout,
// 30 s by default, and a value that is not positive is refused by name.
func TestWatchStallTimeoutFlagAndFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "confd.toml")
	if err := os.WriteFile(file, []byte("watch_stall_timeout = \"45s\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	absent := filepath.Join(dir, "absent.toml")
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"-config-file", absent}, 30 * time.Second},
		{[]string{"-config-file", absent, "-watch-stall-timeout", "2m"}, 2 * time.Minute},
		{[]string{"-config-file", absent, "--watch-stall-timeout=90s"}, 90 * time.Second},
		{[]string{"-config-file", file}, 45 * time.Second},
		{[]string{"-config-file", file, "-watch-stall-timeout", "1m"}, time.Minute},
	} {
		var out, errb bytes.Buffer
		c, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log == nil {
			if tc.args[1] == absent {
				c, log, code = configure(tc.args[2:], &out, &errb, envOf(nil))
			}
			if log == nil {
				t.Fatalf("configure(%v) exit %d: %s", tc.args, code, errb.String())
			}
		}
		if c.Store.WatchStallTimeout != tc.want {
			t.Errorf("configure(%v): stall timeout %s, want %s", tc.args, c.Store.WatchStallTimeout, tc.want)
		}
	}
	var out, errb bytes.Buffer
	if _, log, code := configure([]string{"-watch-stall-timeout", "0s"}, &out, &errb, envOf(nil)); log != nil || code != 2 || !bytes.Contains(errb.Bytes(), []byte("-watch-stall-timeout")) {
		t.Errorf("-watch-stall-timeout 0s: exit %d, stderr %q", code, errb.String())
	}
}
