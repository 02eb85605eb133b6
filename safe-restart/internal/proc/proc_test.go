package proc

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExitStatusAndEnv(t *testing.T) {
	var out bytes.Buffer
	p, err := Start(Spec{Argv: []string{"sh", "-c", `echo "$FOO"; exit 3`}, Env: []string{"FOO=bar"}, Stdout: &out, Stderr: &out, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Wait()
	if r.ExitCode != 3 || r.OK() || r.TimedOut || !strings.Contains(r.Err.Error(), "status 3") {
		t.Fatalf("result %+v", r)
	}
	if out.String() != "bar\n" {
		t.Fatalf("output %q", out.String())
	}
	p, _ = Start(Spec{Argv: []string{"true"}, Timeout: 10 * time.Second})
	if r := p.Wait(); !r.OK() || r.ExitCode != 0 {
		t.Fatalf("true: %+v", r)
	}
}

func TestOwnProcessGroup(t *testing.T) {
	p, err := Start(Spec{Argv: []string{"sh", "-c", "exit 0"}, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := syscall.Getpgid(p.Pid())
	if err == nil && pgid != p.Pid() { // the process may already be gone
		t.Fatalf("pgid %d, pid %d", pgid, p.Pid())
	}
	p.Wait()
}

func TestTimeoutKillsWholeGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child")
	// The shell ignores SIGTERM, so only SIGKILL after the grace ends it;
	// its background child must die with it.
	script := `trap '' TERM; sleep 60 & echo $! > ` + pidFile + `; wait; wait`
	var out bytes.Buffer
	start := time.Now()
	p, err := Start(Spec{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out, Timeout: 300 * time.Millisecond, KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Wait()
	if !r.TimedOut || r.OK() || !strings.Contains(r.Err.Error(), "did not finish within") {
		t.Fatalf("result %+v", r)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %s", el)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	// The child is killed; once reaped by init it no longer exists. Zombie
	// state until then still means killed: check /proc for "Z" or absence.
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the timed-out command is still running: %s", child, stat)
		}
		time.Sleep(10 * time.Millisecond) // polling /proc: there is no event to wait for
	}
}

func TestStartFailure(t *testing.T) {
	if _, err := Start(Spec{Argv: []string{"/nonexistent/cmd"}}); err == nil {
		t.Fatal("started a missing command")
	}
	if _, err := Start(Spec{}); err == nil {
		t.Fatal("started an empty command")
	}
}

func TestQuote(t *testing.T) {
	got := Quote([]string{"sh", "-c", "echo 'a b'", ""})
	want := `sh -c 'echo '\''a b'\''' ''`
	if got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}
