// Package proc runs the restart command in its own process group with a
// timeout, killing the whole group when the timeout passes.
package proc

import (
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Spec describes one run.
type Spec struct {
	Argv []string
	// Env is the complete environment of the command.
	Env            []string
	Stdout, Stderr io.Writer
	// Timeout is how long the command may run before its process group gets
	// SIGTERM; KillGrace later it gets SIGKILL.
	Timeout   time.Duration
	KillGrace time.Duration
}

// Result is how the command ended.
type Result struct {
	// ExitCode is the exit status, or -1 when it died of a signal or never ran.
	ExitCode int
	Signal   syscall.Signal
	TimedOut bool
	Duration time.Duration
	// Err is set when the command did not succeed; it says why in words.
	Err error
}

// OK reports success (exit status 0 within the timeout).
func (r Result) OK() bool { return r.Err == nil }

// Process is a started command.
type Process struct {
	spec  Spec
	cmd   *exec.Cmd
	start time.Time
	done  chan struct{}
	res   Result
}

// Start starts the command. The timeout runs from here.
func Start(spec Spec) (*Process, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("empty command")
	}
	if spec.KillGrace <= 0 {
		spec.KillGrace = 5 * time.Second
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = spec.Env
	cmd.Stdout, cmd.Stderr = spec.Stdout, spec.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Output copied through pipes must not keep Wait waiting for
	// grandchildren that inherited them.
	cmd.WaitDelay = spec.KillGrace
	p := &Process{spec: spec, cmd: cmd, done: make(chan struct{})}
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", Quote(spec.Argv), err)
	}
	go p.wait()
	return p, nil
}

// Pid is the process (and process group) id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done closes when the command has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Terminate ends the command early: SIGTERM to its process group, then
// SIGKILL after grace if it has not ended. It does not wait.
func (p *Process) Terminate(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	go func() {
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}()
}

// Wait blocks until the command has ended and returns how.
func (p *Process) Wait() Result {
	<-p.done
	return p.res
}

func (p *Process) wait() {
	defer close(p.done)
	waitc := make(chan error, 1)
	go func() { waitc <- p.cmd.Wait() }()
	pgid := p.cmd.Process.Pid
	var timedOut bool
	var err error
	var timeout <-chan time.Time
	if p.spec.Timeout > 0 {
		t := time.NewTimer(p.spec.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case err = <-waitc:
	case <-timeout:
		timedOut = true
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case err = <-waitc:
		case <-time.After(p.spec.KillGrace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			err = <-waitc
		}
		// Whatever is left of the group goes too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	r := Result{ExitCode: -1, TimedOut: timedOut, Duration: time.Since(p.start)}
	if ps := p.cmd.ProcessState; ps != nil {
		r.ExitCode = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.Signal = ws.Signal()
		}
	}
	argv := Quote(p.spec.Argv)
	switch {
	case timedOut:
		r.Err = fmt.Errorf("%s did not finish within %s; its process group was killed", argv, p.spec.Timeout)
	case r.Signal != 0:
		r.Err = fmt.Errorf("%s was killed by signal %s", argv, r.Signal)
	case r.ExitCode != 0:
		r.Err = fmt.Errorf("%s exited with status %d", argv, r.ExitCode)
	case err != nil:
		// Exit 0, but e.g. output pipes were held open past WaitDelay.
		var ee *exec.ExitError
		if !errors.As(err, &ee) && !errors.Is(err, exec.ErrWaitDelay) {
			r.Err = fmt.Errorf("%s: %w", argv, err)
		}
	}
	p.res = r
}

// Quote renders argv for messages, quoting words that need it.
func Quote(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`;&|<>(){}*?[]#~") {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		} else {
			out[i] = a
		}
	}
	return strings.Join(out, " ")
}
