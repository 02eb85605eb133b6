package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
)

// guardArg is the hidden first argument that makes this binary the
// restart command's group guard (see groupGuard).
const guardArg = "__group-guard"

// The guard's report on its stdin (a socket) once it has the command.
const (
	guardStarted    = "started\n"
	guardNotStarted = "cannot start: "
)

// guardDeathSignal is what the kernel sends the guard when the helper dies.
const guardDeathSignal = syscall.SIGUSR1

// guardedArgv wraps argv so that it runs under the group guard.
func guardedArgv(argv []string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this executable for the command's group guard: %w", err)
	}
	return append([]string{self, guardArg, strconv.Itoa(os.Getpid())}, argv...), nil
}

// groupGuard runs argv as a child in this process's group (the restart
// command's own group) and, when the helper that started it dies, kills the
// whole group. The kernel's parent-death signal (PR_SET_PDEATHSIG) reaches
// only the helper's direct child; without the guard, a command's own
// children (a script's current step, a service it launched) would outlive a
// SIGKILLed helper and overlap the next host's restart. Signals for the
// group reach the command directly; the guard only waits, and ends as the
// command did.
//
// The helper starts the guard early, while it dials etcd and waits for the
// lock, so that the guard's own start-up is off the restart's critical
// path; the guard runs argv only once the helper hands it over: the
// command's environment (which holds the lock's key, and must stay off any
// command line) on the guard's stdin, then EOF. EOF without a hand-over
// (lock refused, hold, preflight, signal) ends the guard quietly, having
// run nothing. The death signal is armed from the spawn, so a helper that
// dies while the guard waits takes the guard with it too.
func groupGuard(args []string) int {
	if len(args) < 2 {
		fmt.Fprintf(os.Stderr, "%s: %s needs PARENT-PID COMMAND...\n", progName, guardArg)
		return exitUsage
	}
	parent, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: bad parent pid %q\n", progName, guardArg, args[0])
		return exitUsage
	}
	death := make(chan os.Signal, 1)
	signal.Notify(death, guardDeathSignal)
	// The group's SIGTERM/SIGINT/SIGHUP/SIGQUIT are the command's to act
	// on; the guard outlives them to report its exit status. Caught, not
	// ignored: an ignored signal would stay ignored in the command.
	group := make(chan os.Signal, 8)
	signal.Notify(group, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	if os.Getppid() != parent { // died before the death signal was armed
		killGroup()
	}
	handover := make(chan handoverResult, 1)
	go func() {
		// stdin stays open after the hand-over: the report goes back on it.
		env, err := readHandover(os.Stdin)
		handover <- handoverResult{env, err}
	}()
	var env []string
	for waiting := true; waiting; {
		select {
		case <-death:
			killGroup()
		case <-group:
		case h := <-handover:
			if errors.Is(h.err, errNoHandover) {
				return 0 // not needed after all: nothing ran
			}
			if h.err != nil {
				fmt.Fprintf(os.Stderr, "%s: %s: %v; not running %s\n", progName, guardArg, h.err, args[1])
				return 127
			}
			env, waiting = h.env, false
		}
	}
	cmd := exec.Command(args[1], args[2:]...)
	// The command's stdin stays nil, /dev/null, as before the guard was
	// started early: the hand-over pipe is the guard's alone.
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		// Reported to the helper, which then knows nothing ran.
		_, _ = fmt.Fprintf(os.Stdin, "%s%v\n", guardNotStarted, err)
		return 127
	}
	_, _ = io.WriteString(os.Stdin, guardStarted)
	_ = os.Stdin.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-death:
			killGroup()
		case <-group:
		case <-done:
			waiting = false
		}
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		// End as the command did, so the helper reports the signal.
		signal.Reset(ws.Signal())
		_ = syscall.Kill(os.Getpid(), ws.Signal())
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

func killGroup() {
	_ = syscall.Kill(0, syscall.SIGKILL) // ends us too
	os.Exit(128 + int(syscall.SIGKILL))
}

// A hand-over on the guard's stdin is handoverTag, the number of
// environment entries and the entries, each NUL-terminated (no entry can
// hold a NUL), then EOF. The count tells a complete hand-over from one cut
// short, which runs nothing.
const handoverTag = "env"

// errNoHandover is EOF before any byte: the helper did not run the command.
var errNoHandover = errors.New("no command handed over")

type handoverResult struct {
	env []string
	err error
}

// encodeHandover is what the helper writes to a waiting guard's stdin.
func encodeHandover(env []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\x00%d\x00", handoverTag, len(env))
	for _, kv := range env {
		b.WriteString(kv)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// readHandover reads a hand-over to its EOF.
func readHandover(r io.Reader) ([]string, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read the hand-over: %w", err)
	}
	if len(data) == 0 {
		return nil, errNoHandover
	}
	fields := bytes.Split(data, []byte{0})
	// A complete hand-over ends with a NUL: its last field is empty.
	if len(fields) < 3 || string(fields[0]) != handoverTag || len(fields[len(fields)-1]) != 0 {
		return nil, errors.New("incomplete hand-over")
	}
	n, err := strconv.Atoi(string(fields[1]))
	if err != nil || n != len(fields)-3 {
		return nil, errors.New("incomplete hand-over")
	}
	env := make([]string, n)
	for i := range env {
		env[i] = string(fields[2+i])
	}
	return env, nil
}
