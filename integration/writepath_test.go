package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// owedResource is a resource whose reload_cmd appends "reload" to the
// returned log file, after running pre (which may fail or kill confd).
func owedResource(t *testing.T, c *confdir, pre string) (dest, reloads string) {
	t.Helper()
	reloads = filepath.Join(t.TempDir(), "reloads")
	dest = c.resource("app", "[template]\nsrc = \"app.tmpl\"\ndest = \"DEST\"\nkeys = [\"/w\"]\nreload_cmd = \""+pre+"echo reload >> "+reloads+"\"\n", "{{getv \"/w/v\"}}\n")
	return dest, reloads
}

// straceConfd runs confd under strace, failing fsyncs of dir with EIO as
// inject says (e.g. "when=2"; "" for every one). It returns confd's stderr
// and whether it exited 0.
func straceConfd(t *testing.T, dir, when string, args []string) (string, bool) {
	t.Helper()
	inject := "inject=fsync:error=EIO"
	if when != "" {
		inject += ":" + when
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "strace", append([]string{"-f", "-o", "/dev/null", "-P", dir, "-e", "trace=fsync", "-e", inject, confdBin}, args...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("strace confd: %v", err)
	}
	return errb.String(), err == nil
}

func needStrace(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("no strace")
	}
	if err := exec.Command("strace", "-o", "/dev/null", "true").Run(); err != nil {
		t.Skipf("strace cannot trace here: %v", err)
	}
}

// A directory fsync failing after the rename (injected with strace) must
// not lose the reload: the first run exits 1 saying it is owed, the next
// -onetime run performs it, and only once.
func TestFsyncFailureAfterRenameReloadsOnNextOnetime(t *testing.T) {
	needStrace(t)
	s := etcdtest.Start(t)
	s.Put(t, "/w/v", "new")
	// The destination's directory may be fsynced more than once (here:
	// after recording the owed reload, then after the rename); the one
	// after the rename is to fail. strace counts per thread and Go may run
	// them on different threads, so attempts alternate between failing the
	// first and the second, and one that did not fail the fsync after the
	// rename (the file is not yet new) is repeated afresh.
	for attempt := 1; ; attempt++ {
		c := newConfdir(t)
		dest, reloads := owedResource(t, c, "")
		args := append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)
		stderr, ok := straceConfd(t, filepath.Dir(dest), fmt.Sprintf("when=%d", 2-attempt%2), args)
		// The fsync that failed may also be the one after the reload (the
		// owed record's removal): the reload ran, so this attempt shows
		// nothing about a reload owed across runs.
		if !strings.Contains(stderr, "fsync directory") || readFileOr(dest) != "new\n" || readFileOr(reloads) != "" {
			if attempt < 10 {
				continue
			}
			t.Skipf("the injected fsync failure never hit the fsync after the rename in %d attempts", attempt)
		}
		if ok || !strings.Contains(stderr, "reload_cmd is owed and will be retried on the next run") {
			t.Fatalf("first run (exit 0: %v) does not say the reload is owed:\n%s", ok, stderr)
		}
		if readFileOr(dest) != "new\n" || readFileOr(reloads) != "" {
			t.Fatalf("after first run: dest %q, reloads %q", readFileOr(dest), readFileOr(reloads))
		}
		for i := 0; i < 2; i++ {
			if r := confd(t, nil, args...); r.code != 0 {
				t.Fatalf("run %d: exit %d:\n%s", i+2, r.code, r.stderr)
			}
		}
		if readFileOr(reloads) != "reload\n" {
			t.Errorf("reloads = %q, want exactly one", readFileOr(reloads))
		}
		if len(c.stageFiles()) != 0 {
			t.Errorf("files left beside dest: %v", c.stageFiles())
		}
		return
	}
}

// Every fsync of the destination's directory failing: the first one (the
// owed-reload record's) stops the update before the rename, the live file
// is unchanged, and the next run updates and reloads once.
func TestFsyncFailureBeforeRenameLeavesLiveFile(t *testing.T) {
	needStrace(t)
	s := etcdtest.Start(t)
	s.Put(t, "/w/v", "new")
	c := newConfdir(t)
	dest, reloads := owedResource(t, c, "")
	if err := os.WriteFile(dest, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)
	stderr, ok := straceConfd(t, filepath.Dir(dest), "", args)
	if ok || !strings.Contains(stderr, dest+" left unchanged") {
		t.Fatalf("first run (exit 0: %v) does not say the file is unchanged:\n%s", ok, stderr)
	}
	if readFileOr(dest) != "old\n" || readFileOr(reloads) != "" {
		t.Fatalf("after first run: dest %q, reloads %q", readFileOr(dest), readFileOr(reloads))
	}
	for i := 0; i < 2; i++ {
		if r := confd(t, nil, args...); r.code != 0 {
			t.Fatalf("run %d: exit %d:\n%s", i+2, r.code, r.stderr)
		}
	}
	if readFileOr(dest) != "new\n" || readFileOr(reloads) != "reload\n" {
		t.Errorf("dest %q, reloads %q, want the update and exactly one reload", readFileOr(dest), readFileOr(reloads))
	}
}

// confd killed (SIGKILL) after the rename, while its reload_cmd runs: the
// next -onetime run still owes and performs the reload.
func TestSigkillAfterRenameReloadsOnNextOnetime(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/w/v", "new")
	c := newConfdir(t)
	armed := filepath.Join(t.TempDir(), "armed")
	if err := os.WriteFile(armed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// $PPID of the reload's shell is confd.
	dest, reloads := owedResource(t, c, "if [ -e "+armed+" ]; then rm "+armed+"; kill -KILL $PPID; sleep 60; fi; ")
	args := append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)
	if r := confd(t, nil, args...); r.code == 0 {
		t.Fatalf("first run survived its SIGKILL:\n%s", r.stderr)
	}
	if readFileOr(dest) != "new\n" || readFileOr(reloads) != "" {
		t.Fatalf("after the kill: dest %q, reloads %q", readFileOr(dest), readFileOr(reloads))
	}
	for i := 0; i < 2; i++ {
		if r := confd(t, nil, args...); r.code != 0 {
			t.Fatalf("run %d: exit %d:\n%s", i+2, r.code, r.stderr)
		}
	}
	if readFileOr(reloads) != "reload\n" {
		t.Errorf("reloads = %q, want exactly one", readFileOr(reloads))
	}
}

// SIGTERM to confd -onetime while its reload_cmd runs: the reload gets
// SIGTERM and its grace (its handler completes; no SIGKILL), confd exits
// non-zero, and the next run performs the reload.
func TestSigtermDuringOnetimeReloadGivesGrace(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/w/v", "new")
	c := newConfdir(t)
	dir := t.TempDir()
	running, clean, first := filepath.Join(dir, "running"), filepath.Join(dir, "clean"), filepath.Join(dir, "first")
	if err := syscall.Mkfifo(running, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dest, reloads := owedResource(t, c, "if [ -e "+first+" ]; then rm "+first+"; trap 'sleep 0.5; echo clean > "+clean+"; exit 1' TERM; echo up > "+running+"; while :; do sleep 1; done; fi; ")
	args := append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-command-grace", "30s")
	cmd := exec.Command(confdBin, args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(running); err != nil { // returns once the reload runs
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if err == nil {
		t.Fatalf("exit 0 although the reload was stopped:\n%s", errb.String())
	}
	if readFileOr(clean) != "clean\n" {
		t.Errorf("reload_cmd's TERM handler did not complete (SIGKILLed?):\n%s", errb.String())
	}
	if !strings.Contains(errb.String(), "retried on the next run") {
		t.Errorf("stderr does not say the reload is retried:\n%s", errb.String())
	}
	if r := confd(t, nil, args...); r.code != 0 || readFileOr(reloads) != "reload\n" || readFileOr(dest) != "new\n" {
		t.Fatalf("next run: exit %d, reloads %q:\n%s", r.code, readFileOr(reloads), r.stderr)
	}
}

// Commands never see confd's etcd credentials; their output is logged one
// quoted line per record, in confd's one-line format.
func TestCommandsGetNoCredentialsAndLogPerLine(t *testing.T) {
	c := newConfdir(t)
	envOut := filepath.Join(t.TempDir(), "env")
	c.resource("app", "[template]\nsrc = \"app.tmpl\"\ndest = \"DEST\"\nkeys = [\"/w\"]\ncheck_cmd = \"env > "+envOut+".check\"\nreload_cmd = \"env > "+envOut+"; printf 'line one\\\\nline two\\\\n'\"\n", "{{getv \"/w/v\"}}\n")
	r := confd(t, []string{"W_V=x", "CONFD_PASSWORD=pw-must-not-leak", "CONFD_USERNAME=user-must-not-leak", "KEEP_ME=1"},
		"-onetime", "-backend", "env", "-confdir", c.Dir, "-log-level", "debug")
	if r.code != 0 {
		t.Fatalf("exit %d:\n%s", r.code, r.stderr)
	}
	for _, f := range []string{envOut, envOut + ".check"} {
		env := readFileOr(f)
		if !strings.Contains(env, "KEEP_ME=1") {
			t.Fatalf("%s: command environment not captured: %q", f, env)
		}
		if strings.Contains(env, "must-not-leak") {
			t.Errorf("%s: credentials in a command's environment:\n%s", f, env)
		}
	}
	var recs []string
	for _, l := range strings.Split(r.stderr, "\n") {
		if strings.Contains(l, "reload_cmd output:") {
			recs = append(recs, l)
		}
	}
	if len(recs) != 2 || !strings.Contains(recs[0], ` INFO reload_cmd output: "line one"`) || !strings.Contains(recs[1], ` INFO reload_cmd output: "line two"`) {
		t.Errorf("reload output records:\n%s\nstderr:\n%s", strings.Join(recs, "\n"), r.stderr)
	}
}

// A bind-mounted destination on a full file system: the in-place write
// cannot reserve the space, so the live file keeps every byte and the
// error says it is unchanged. Root and a private mount namespace needed.
func TestFullFilesystemBehindBindMountLeavesLiveFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	if err := exec.Command("unshare", "-m", "true").Run(); err != nil {
		t.Skipf("unshare -m not permitted here: %v", err)
	}
	c := newConfdir(t)
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB
	dest := c.resource("big", "[template]\nsrc = \"big.tmpl\"\ndest = \"DEST\"\nkeys = [\"/w\"]\nmode = \"0644\"\n", big+"{{getv \"/w/v\"}}\n")
	if err := os.WriteFile(dest, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpfs := t.TempDir()
	script := strings.Join([]string{
		"set -e",
		"mount -t tmpfs -o size=128k tmpfs " + tmpfs,
		"printf 'old live content\\n' > " + tmpfs + "/live",
		"dd if=/dev/zero of=" + tmpfs + "/filler bs=4k 2>/dev/null || true", // fill it up
		"mount --bind " + tmpfs + "/live " + dest,
		"set +e",
		"W_V=x " + confdBin + " -onetime -backend env -confdir " + c.Dir,
		"echo exit=$?",
		"echo live=$(cat " + tmpfs + "/live)",
	}, "\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("script: %v\n%s", err, out)
	}
	for _, want := range []string{"exit=1", "live=old live content", "cannot reserve", dest + " left unchanged"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if len(c.stageFiles()) != 0 {
		t.Errorf("files left beside dest: %v", c.stageFiles())
	}
}

// A bind-mounted destination whose in-place write is cut by a SIGKILL
// (strace kills confd as it truncates the file after writing the new,
// shorter content over the old: half new, half old). The old content was
// kept, mode 0600, in .NAME.confd-previous, named by the owed record; the
// next run restores it before anything else, says so, then writes the new
// content and leaves neither copy nor record. Root, a private mount
// namespace and strace needed.
func TestTornInPlaceWriteIsRestoredOnNextRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	if err := exec.Command("unshare", "-m", "true").Run(); err != nil {
		t.Skipf("unshare -m not permitted here: %v", err)
	}
	needStrace(t)
	c := newConfdir(t)
	dest := c.resource("bind", "[template]\nsrc = \"bind.tmpl\"\ndest = \"DEST\"\nkeys = [\"/w\"]\nmode = \"0644\"\n", "new {{getv \"/w/v\"}}\n")
	if err := os.WriteFile(dest, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(t.TempDir(), "live")
	old := "old content, longer than the new one\n"
	if err := os.WriteFile(live, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	prev := filepath.Join(c.Out, ".bind.confd-previous")
	run := confdBin + " -onetime -backend env -confdir " + c.Dir
	script := strings.Join([]string{
		"export W_V=x",
		"mount --bind " + live + " " + dest,
		"strace -f -o /dev/null -P " + dest + " -e trace=ftruncate -e inject=ftruncate:signal=SIGKILL " + run + " 2>/dev/null",
		"echo killed=$?",
		"echo torn=$(cat " + dest + ")",
		"echo previous=$(stat -c %a " + prev + ") $(cat " + prev + ")",
		"echo record=$(cat " + filepath.Join(c.Out, ".confd-reload-owed.bind") + ")",
		run + " 2>&1",
		"echo exit=$?",
		"echo live=$(cat " + dest + ")",
	}, "\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("script: %v\n%s", err, out)
	}
	for _, want := range []string{
		"killed=137",
		"torn=new x ntent, longer than the new one",
		"previous=600 " + strings.TrimSpace(old),
		"record=in-place sha256:",
		"was torn by an interrupted in-place write",
		"exit=0",
		"live=new x",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if i, j := strings.Index(string(out), "was torn"), strings.Index(string(out), "out of sync"); i < 0 || j < 0 || i > j {
		t.Errorf("the restore is not logged before the render's verdict:\n%s", out)
	}
	if got := readFile(t, live); got != "new x\n" {
		t.Errorf("live = %q", got)
	}
	if len(c.stageFiles()) != 0 {
		t.Errorf("files left beside dest: %v", c.stageFiles())
	}
}
