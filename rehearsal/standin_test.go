//go:build rehearsal

package rehearsal

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// systemd stands in for one host's systemd, for one unit:
// kube-apiserver.service. `systemctl restart kube-apiserver.service` (the
// host's /bin/systemctl, the test binary in REHEARSAL_STANDIN mode) asks
// it over a unix socket; like systemd it stops the running apiserver,
// starts the unit's ExecStart with its EnvironmentFiles read afresh, and
// answers once the new process runs. The apiserver is its child, not the
// caller's: killing systemctl does not undo a restart.
type systemd struct {
	h        *host
	ln       net.Listener
	job      sync.Mutex // one job at a time, as systemd queues them
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts atomic.Int64

	hookMu sync.Mutex
	hook   func(phase string, caller int, conn net.Conn)

	cm controllerManager // kube-controller-manager.service (controllermanager_test.go)
}

func startSystemd(t *testing.T, h *host) *systemd {
	t.Helper()
	ln, err := net.Listen("unix", h.Path("/run/systemd/private"))
	if err != nil {
		t.Fatal(err)
	}
	s := &systemd{h: h, ln: ln}
	go s.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		s.job.Lock()
		defer s.job.Unlock()
		s.stop(syscall.SIGKILL)
		s.cm.mu.Lock()
		defer s.cm.mu.Unlock()
		s.cm.stopLocked(syscall.SIGKILL)
	})
	return s
}

// onNextRestart sets a hook for the next restart only, called with phase
// "stopped" (old apiserver gone, ExecStartPre not run yet), "starting"
// (ExecStartPre passed, the new apiserver about to start) and "done"
// (answered, and the caller has hung up), the caller's pid and its
// connection.
func (s *systemd) onNextRestart(hook func(phase string, caller int, conn net.Conn)) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.hook = hook
}

func (s *systemd) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go s.handle(c.(*net.UnixConn))
	}
}

func (s *systemd) handle(c *net.UnixConn) {
	defer c.Close()
	line, err := readLine(bufio.NewReader(c))
	if err != nil {
		return
	}
	if line == "restart "+cmUnit {
		if err := s.restartControllerManager(); err != nil {
			fmt.Fprintf(c, "failed: %v\n", err)
			return
		}
		fmt.Fprintf(c, "ok\n")
		return
	}
	if line != "restart kube-apiserver.service" {
		fmt.Fprintf(c, "unsupported: %s\n", line)
		return
	}
	s.hookMu.Lock()
	hook := s.hook
	s.hook = nil
	s.hookMu.Unlock()
	caller := peerPID(c)
	err = s.restart(func(phase string) {
		if hook != nil {
			hook(phase, caller, c)
		}
	})
	if err != nil {
		fmt.Fprintf(c, "failed: %v\n", err)
	} else {
		fmt.Fprintf(c, "ok\n")
	}
	if hook != nil {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Read(make([]byte, 1)) // EOF: the caller is gone
		hook("done", caller, c)
	}
}

func (s *systemd) restart(hook func(string)) error {
	s.job.Lock()
	defer s.job.Unlock()
	h := s.h
	h.f.tl.stopping(h.name)
	s.stop(syscall.SIGTERM)
	hook("stopped")
	u, err := LoadUnit(h.Path("/etc/systemd/system"), "kube-apiserver.service")
	if err != nil {
		return err
	}
	env, err := u.Env(h.baseEnv())
	if err != nil {
		return err
	}
	argv, _, err := Command(u.ExecStart[0], env)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(h.Path("/var/log/kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// ExecStartPre= (the shipped wait-trusted drop-in among them) runs
	// first, in the start job, with the unit's environment; one that fails
	// without a leading "-" fails the start and leaves the unit down.
	for _, line := range u.ExecStartPre {
		pre, ignore, err := Command(line, env)
		if err != nil {
			return err
		}
		fmt.Fprintf(logf, "==== %s systemd: ExecStartPre %s\n", time.Now().Format(time.RFC3339Nano), line)
		c := exec.Command(pre[0], pre[1:]...)
		c.Env, c.Stdout, c.Stderr = env, logf, logf
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Run(); err != nil && !ignore {
			fmt.Fprintf(logf, "==== %s systemd: ExecStartPre failed (%v): kube-apiserver not started\n", time.Now().Format(time.RFC3339Nano), err)
			return fmt.Errorf("ExecStartPre %s: %w", pre[0], err)
		}
	}
	hook("starting")
	fmt.Fprintf(logf, "==== %s systemd: starting kube-apiserver\n", time.Now().Format(time.RFC3339Nano))
	argv, env, attr := inUTS(h, argv, env)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = attr
	// Pdeathsig fires when the OS thread that started the child exits, not
	// the process: start and wait on one locked thread, and unlock it
	// before the goroutine returns. A goroutine that returns while locked
	// makes the runtime end its thread, and with it every Pdeathsig child
	// that thread ever forked, whoever forked it: etcd itself, started
	// earlier on that thread by etcdtest, was SIGKILLed so mid-scenario.
	exited, err := startOnLockedThread(cmd)
	if err != nil {
		return err
	}
	s.cmd, s.exited = cmd, exited
	s.restarts.Add(1)
	h.f.tl.started(h.name)
	return nil
}

// stopUnit stops the apiserver as `systemctl stop kube-apiserver` would.
func (s *systemd) stopUnit() {
	s.job.Lock()
	defer s.job.Unlock()
	s.h.f.tl.stopping(s.h.name)
	s.stop(syscall.SIGTERM)
}

// stop ends the running apiserver: sig, then SIGKILL after 60 s (systemd's
// TimeoutStopSec is longer; a test has no minute to spare).
func (s *systemd) stop(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	s.cmd = nil
}

func peerPID(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// parentPID reads a process's parent from /proc.
func parentPID(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may contain spaces.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0, errors.New("short /proc stat")
	}
	return strconv.Atoi(f[1])
}

// systemctlMain is the host's systemctl: it forwards its arguments to the
// host's systemd and exits 0 once the job is done, 1 if it failed.
func systemctlMain(socket string, args []string) int {
	if len(args) == 0 || socket == "" {
		fmt.Fprintln(os.Stderr, "systemctl (rehearsal stand-in): no command or no REHEARSAL_SYSTEMD")
		return 1
	}
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
		return 1
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "%s\n", strings.Join(args, " ")); err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
		return 1
	}
	answer, err := readLine(bufio.NewReader(c))
	if answer != "ok" {
		fmt.Fprintf(os.Stderr, "systemctl: job for %s failed: %s %v\n", strings.Join(args[1:], " "), answer, err)
		return 1
	}
	return 0
}

// startOnLockedThread starts cmd and waits for it on one locked OS thread
// (Pdeathsig follows the thread that forked the child, see
// systemd.restart); exited is closed when cmd has exited.
func startOnLockedThread(cmd *exec.Cmd) (exited chan struct{}, err error) {
	exited = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
