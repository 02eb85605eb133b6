package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/apply"
)

// -dest-lock-timeout: both flag spellings, confd.toml's dest_lock_timeout,
// a default of one minute, and a zero refused naming the flag.
func TestDestLockTimeoutFlagAndFileKey(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(cfg, []byte("dest_lock_timeout = \"3s\"\nbackend = \"env\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"-backend", "env"}, time.Minute},
		{[]string{"-config-file", cfg}, 3 * time.Second},
		{[]string{"-config-file", cfg, "-dest-lock-timeout", "1m30s"}, 90 * time.Second},
		{[]string{"-config-file", cfg, "--dest-lock-timeout=2s"}, 2 * time.Second},
	} {
		var out, errb bytes.Buffer
		c, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log == nil || c.DestLockTimeout != tc.want {
			t.Errorf("configure(%v): exit %d, %v, want %v: %s", tc.args, code, c, tc.want, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if _, log, _ := configure([]string{"-backend", "env", "-dest-lock-timeout", "0s"}, &out, &errb, envOf(nil)); log != nil || !strings.Contains(errb.String(), "-dest-lock-timeout") {
		t.Errorf("zero timeout accepted: %s", errb.String())
	}
}

// -lock-dir: both flag spellings, confd.toml's lock_dir, the default
// (root's /run/confd/locks), and a relative directory refused naming the flag (each
// working directory would be another lock directory).
func TestLockDirFlagAndFileKey(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(cfg, []byte("lock_dir = \"/run/user/1000/confd/locks\"\nbackend = \"env\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-backend", "env"}, apply.DefaultLockDir()},
		{[]string{"-config-file", cfg}, "/run/user/1000/confd/locks"},
		{[]string{"-config-file", cfg, "-lock-dir", "/var/lib/confd/locks"}, "/var/lib/confd/locks"},
		{[]string{"-config-file", cfg, "--lock-dir=/tmp/l"}, "/tmp/l"},
	} {
		var out, errb bytes.Buffer
		c, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log == nil || c.LockDir != tc.want {
			t.Errorf("configure(%v): exit %d, %v, want %v: %s", tc.args, code, c, tc.want, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if _, log, _ := configure([]string{"-backend", "env", "-lock-dir", "locks"}, &out, &errb, envOf(nil)); log != nil || !strings.Contains(errb.String(), "-lock-dir") {
		t.Errorf("relative lock directory accepted: %s", errb.String())
	}
}
