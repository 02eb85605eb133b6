// Package groupguard runs a command under a guard process that ends the
// command's whole process group when the guard's owner dies, for both
// binaries: confd's check_cmd and reload_cmd, and
// kube-apiserver-safe-restart's restart command. Each binary's main runs
// Main when its first argument is Arg; Start runs a runner.Spec's command
// under the running binary re-executed as the guard.
//
// The kernel's parent-death signal (PR_SET_PDEATHSIG) reaches only the
// owner's direct child: without the guard, a command's own children (a
// script's current step, a service it launched) would outlive a SIGKILLed
// owner, and overlap what the next owner runs. The guard is that direct
// child; the command runs in the guard's process group. Signals for the
// group reach the command directly; the guard only waits, and ends as the
// command did.
package groupguard

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keysync/confd/internal/runner"
)

// Arg is the hidden first argument that makes a binary the guard.
const Arg = "__group-guard"

// DeathSignal is what the kernel sends the guard when its owner dies.
const DeathSignal = syscall.SIGUSR1

// Exit statuses of the guard itself.
const (
	// ExitUsage is a malformed guard command line.
	ExitUsage = 2
	// ExitNotRun: the command could not be started; nothing ran.
	ExitNotRun = 127
)

// Options shape a guard.
type Options struct {
	// Grace is what the command gets when the owner dies: SIGTERM to the
	// group, then SIGKILL after Grace. Zero is SIGKILL at once.
	Grace time.Duration
	// Lock is a file (an flock the owner holds) that the guard keeps open,
	// and the command does not inherit, until the group is gone: an owner
	// that takes the same lock after a crash waits for the old command.
	Lock *os.File
}

// Start starts spec's command under a guard, and returns the owner's end
// of the guard's status pipe with it. A dead guard's group is waited for
// up to the command's grace.
func Start(ctx context.Context, spec runner.Spec, o Options) (*runner.Process, *Watch, error) {
	status, statusW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("%s not run: status pipe for its group guard: %w", cmp.Or(spec.Name, runner.Quote(spec.Argv)), err)
	}
	w := &Watch{r: bufio.NewReader(status), file: status, grace: spec.Grace}
	if w.grace <= 0 {
		w.grace = runner.DefaultGrace
	}
	guarded := wrap(spec, o, statusW)
	guarded.OnExit = w.OnExit
	p, err := runner.Start(ctx, guarded)
	_ = statusW.Close()
	if err != nil {
		_ = status.Close()
		return nil, nil, err
	}
	return p, w, nil
}

// wrap returns spec changed to run its command under a guard: the guard
// re-executes this binary, carries the parent-death signal, and gets the
// lock and status files as extra descriptors. Messages still name the
// command, not the guard. status is the write end of a pipe on which the
// guard reports that the command started (StartedLine) or could not, and
// how it ended ("exit N" or "signal N") just before it ends itself. A
// guard that ends without a report died (or was killed) on its own: see
// Watch.
func wrap(spec runner.Spec, o Options, status *os.File) runner.Spec {
	if spec.Name == "" {
		spec.Name = runner.Quote(spec.Argv)
	}
	args := []string{self(), Arg}
	if o.Grace > 0 {
		args = append(args, "-grace="+o.Grace.String())
	}
	extra := append([]*os.File(nil), spec.ExtraFiles...)
	if o.Lock != nil {
		args = append(args, "-lock-fd="+strconv.Itoa(3+len(extra)))
		extra = append(extra, o.Lock)
	}
	args = append(args, "-status-fd="+strconv.Itoa(3+len(extra)))
	extra = append(extra, status)
	if o.Grace > 0 {
		// The command may still write while it cleans up after our death:
		// the guard then reads (and drops) its output, instead of the
		// command dying of SIGPIPE.
		// runner passes them after the extra files: stdout's, then stderr's.
		spec.ShareOutputReaders = true
		fds := strconv.Itoa(3 + len(extra))
		if !spec.CombinedOutput {
			fds += "," + strconv.Itoa(4+len(extra))
		}
		args = append(args, "-drain-fds="+fds)
	}
	args = append(args, strconv.Itoa(os.Getpid()), "--")
	spec.Argv = append(args, spec.Argv...)
	spec.ExtraFiles = extra
	spec.ParentDeathSignal = DeathSignal
	return spec
}

// self is this binary's path, for the guard to re-execute: by name, so
// that ps shows "confd __group-guard ..." rather than "exe"; through
// /proc/self/exe when the file was replaced or removed since it started
// (a package upgrade), which still runs this very binary.
func self() string {
	p, err := os.Executable()
	if err != nil || strings.HasSuffix(p, " (deleted)") {
		return "/proc/self/exe"
	}
	fi, err := os.Stat(p)
	exe, exeErr := os.Stat("/proc/self/exe")
	if err != nil || exeErr != nil || !os.SameFile(fi, exe) {
		return "/proc/self/exe"
	}
	return p
}

// options are the guard's parsed command line.
type options struct {
	grace    time.Duration
	drainFDs []int
	lockFD   int
	statusFD int
	parent   int
	argv     []string
}

func parse(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet(Arg, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Main says what is wrong
	fs.DurationVar(&o.grace, "grace", 0, "")
	fs.IntVar(&o.lockFD, "lock-fd", -1, "")
	fs.IntVar(&o.statusFD, "status-fd", -1, "")
	fs.Func("drain-fds", "", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			fd, err := strconv.Atoi(f)
			if err != nil {
				return err
			}
			o.drainFDs = append(o.drainFDs, fd)
		}
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if args = fs.Args(); len(args) < 3 || args[1] != "--" {
		return o, errors.New("needs [OPTIONS] PARENT-PID -- COMMAND")
	}
	p, err := strconv.Atoi(args[0])
	if err != nil {
		return o, fmt.Errorf("bad parent pid %q", args[0])
	}
	o.parent, o.argv = p, args[2:]
	return o, nil
}

// Main is the guard: it runs the command, and when its owner dies (the
// death signal, or the owner gone already at the start) it ends the
// command's group: at once if the command has not been handed over yet,
// else SIGTERM and, after the grace, SIGKILL (which ends the guard too). It
// returns the command's exit status; a command killed by a signal is
// re-raised, so that the owner sees the signal.
func Main(prog string, args []string) int {
	o, err := parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", prog, Arg, err)
		return ExitUsage
	}
	// The command must not inherit the lock or the status pipe: the lock
	// is released when the guard (the last of the group) ends, and a
	// status pipe held by a straggler would never report EOF.
	for _, fd := range append([]int{o.lockFD, o.statusFD}, o.drainFDs...) {
		if fd >= 0 {
			syscall.CloseOnExec(fd)
		}
	}
	death := make(chan os.Signal, 1)
	signal.Notify(death, DeathSignal)
	// The group's SIGTERM/SIGINT/SIGHUP/SIGQUIT are the command's to act
	// on; the guard outlives them to report its exit status. Caught, not
	// ignored: an ignored signal would stay ignored in the command.
	group := make(chan os.Signal, 8)
	signal.Notify(group, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	if os.Getppid() != o.parent { // died before the death signal was armed
		killGroup()
	}
	// nil without -status-fd (fd -1): os.File's methods then do nothing
	// but return os.ErrInvalid.
	status := os.NewFile(uintptr(o.statusFD), "status")
	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: start %s: %v\n", prog, o.argv[0], err)
		// And why, for an owner that names it in its own error (Watch.First).
		report(status, "notrun "+strings.ReplaceAll(err.Error(), "\n", " "))
		return ExitNotRun
	}
	// The owner may wait for this line to know the command runs, before it
	// says so.
	_, _ = status.WriteString(StartedLine)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var grace <-chan time.Time
	for waiting := true; waiting; {
		select {
		case <-death:
			death = nil
			if o.grace <= 0 {
				killGroup()
			}
			// The owner no longer reads the command's output: we do,
			// dropping it, so that the command's writes do not fail.
			for _, fd := range o.drainFDs {
				go func(f *os.File) { _, _ = io.Copy(io.Discard, f) }(os.NewFile(uintptr(fd), "output"))
			}
			// SIGTERM first, so that the command can still clean up (the
			// restart helper writes its hold); the guard catches its own.
			_ = syscall.Kill(0, syscall.SIGTERM)
			grace = time.After(o.grace)
		case <-grace:
			killGroup()
		case <-group:
		case <-done:
			waiting = false
		}
	}
	if death == nil {
		// The owner is gone: whatever the command left in the group goes
		// too, and the lock with the guard.
		killGroup()
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		report(status, "signal "+strconv.Itoa(int(ws.Signal())))
		// End as the command did, so the owner reports the signal.
		signal.Reset(ws.Signal())
		_ = syscall.Kill(os.Getpid(), ws.Signal())
		return 128 + int(ws.Signal())
	}
	report(status, "exit "+strconv.Itoa(ws.ExitStatus()))
	return ws.ExitStatus()
}

// report writes the guard's last word on its status pipe and closes it.
func report(f *os.File, status string) {
	_, _ = f.WriteString(status + "\n")
	_ = f.Close()
}

func killGroup() {
	_ = syscall.Kill(0, syscall.SIGKILL) // ends us too
	os.Exit(128 + int(syscall.SIGKILL))
}

// StartedLine is the first line on a guard's status pipe once its command
// started; "notrun WHY" is the first and last when it could not start.
const StartedLine = "started\n"

// reported is whether a guard's whole report, from its status pipe, says
// how its command ended ("exit N", "signal N" or "notrun WHY" after
// StartedLine). Without one, the guard died (SIGKILL, a crash) before the
// command ended, or never started it.
func reported(report string) bool {
	word, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(report, StartedLine)), " ")
	return word == "exit" || word == "signal" || word == "notrun"
}

// Watch is the owner's end of a guard's status pipe (Start). Its OnExit
// reads the guard's report as soon as the guard has exited, and when there
// is none (the guard was killed) the command's group, which nothing
// watches any more, is killed then rather than after the command's output
// has been drained.
type Watch struct {
	mu    sync.Mutex
	r     *bufio.Reader
	file  *os.File // closed once OnExit has read it
	first string   // what First read, part of the report
	grace time.Duration
	// report is all OnExit read, once it has run (exited): a guard that
	// ends before its owner asks for the first line (a command that could
	// not start, on a loaded machine) leaves that line here.
	report string
	exited bool
	// Reported (see reported), and GroupAlive: its group could not be
	// confirmed gone within grace; both set once OnExit has run.
	Reported   bool
	GroupAlive bool
}

// First reads the guard's first line: StartedLine, "notrun WHY\n", or ""
// when the guard ended before it said anything.
func (w *Watch) First() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exited {
		return strings.SplitAfterN(w.report, "\n", 2)[0]
	}
	line, _ := w.r.ReadString('\n')
	w.first += line
	return line
}

// OnExit reads the rest of the report and kills a dead guard's group.
func (w *Watch) OnExit(pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rest, _ := io.ReadAll(w.r) // what it could read: a broken pipe is no report
	if w.file != nil {
		_ = w.file.Close()
	}
	w.report, w.exited = w.first+string(rest), true
	w.Reported = reported(w.report)
	if !w.Reported {
		w.GroupAlive = !groupGone(pid, w.grace)
	}
}

// groupGone kills what is left of process group pgid with SIGKILL and
// waits, up to timeout, until no process of it exists. A false return
// means it could not confirm that (processes that do not die, or zombies
// nobody reaps): the caller must assume the command still runs.
func groupGone(pgid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err := syscall.Kill(-pgid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait) // no event tells that a group emptied: poll, backing off
	}
}
