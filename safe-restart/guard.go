package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
)

// guardArg is the hidden first argument that makes this binary the
// restart command's group guard (see groupGuard).
const guardArg = "__group-guard"

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
	cmd := exec.Command(args[1], args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: start %s: %v\n", progName, args[1], err)
		return 127
	}
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
