//go:build rehearsal

package rehearsal

import (
	"bufio"
	"cmp"
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

	svcMu    sync.Mutex
	services map[string]*service // every other unit (service)
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
		s.svcMu.Lock()
		defer s.svcMu.Unlock()
		for _, v := range s.services {
			v.stop(syscall.SIGKILL)
		}
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
	if verb, unit, _ := strings.Cut(line, " "); unit != "kube-apiserver.service" && unit != cmUnit {
		if err := s.service(unit).do(verb); err != nil {
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
	stopAt := time.Now()
	s.stop(syscall.SIGTERM)
	stopped := time.Now()
	hook("stopped")
	u, env, argv, logf, err := h.unitExec("kube-apiserver.service")
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s systemd: stop took %s\n", stopped.Format(time.RFC3339Nano), stopped.Sub(stopAt).Round(time.Millisecond))
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

// mainPID is the running apiserver's process, 0 when it is down.
func (s *systemd) mainPID() int {
	s.job.Lock()
	defer s.job.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
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
	stopGroup(s.cmd, s.exited, sig, 60*time.Second)
	s.cmd = nil
}

// stopGroup ends a unit's process group (nil cmd: not running): sig, then
// SIGKILL after grace; it returns once the main process has exited.
func stopGroup(cmd *exec.Cmd, exited <-chan struct{}, sig syscall.Signal, grace time.Duration) {
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// unitExec is a unit as systemd would start it: the unit with its
// drop-ins, its environment, its ExecStart expanded, and its log
// (/var/log/NAME.log, appended to; the caller closes it).
func (h *host) unitExec(name string) (u *Unit, env, argv []string, logf *os.File, err error) {
	u, err = LoadUnit(h.Path("/etc/systemd/system"), name)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if env, err = u.Env(h.baseEnv()); err != nil {
		return nil, nil, nil, nil, err
	}
	if argv, _, err = Command(u.ExecStart[0], env); err != nil {
		return nil, nil, nil, nil, err
	}
	logf, err = os.OpenFile(h.Path("/var/log/"+strings.TrimSuffix(name, ".service")+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	return u, env, argv, logf, err
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

// service is any other long-running unit of the stand-in systemd (the
// signer's): `systemctl start|stop|restart|reload NAME`, run as its unit
// says. Type=notify waits for READY=1 on a NOTIFY_SOCKET; ExecReload= runs
// with $MAINPID; Restart=always|on-failure starts it again RestartSec=
// after an exit the stand-in did not ask for; RuntimeDirectory= and
// StateDirectory= are created under the host's /run and /var/lib.
type service struct {
	s      *systemd
	name   string
	mu     sync.Mutex // one job at a time, as systemd queues them
	cmd    *exec.Cmd
	exited chan struct{}
	active bool // started and not stopped: Restart= applies
	// starts counts every start, those Restart= made included.
	starts atomic.Int64
	// startedAt is when the running process was started.
	startedAt time.Time
}

// service is the unit name, created on first use.
func (s *systemd) service(name string) *service {
	s.svcMu.Lock()
	defer s.svcMu.Unlock()
	if s.services == nil {
		s.services = map[string]*service{}
	}
	if s.services[name] == nil {
		s.services[name] = &service{s: s, name: name}
	}
	return s.services[name]
}

// do is `systemctl VERB NAME`.
func (v *service) do(verb string) error {
	switch verb {
	case "start":
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.cmd != nil {
			return nil
		}
		v.active = true
		return v.startLocked()
	case "restart":
		v.mu.Lock()
		defer v.mu.Unlock()
		v.stopLocked(syscall.SIGTERM)
		v.active = true
		return v.startLocked()
	case "stop":
		v.stop(syscall.SIGTERM)
		return nil
	case "reload":
		return v.reload()
	}
	return fmt.Errorf("unsupported: %s %s", verb, v.name)
}

func (v *service) stop(sig syscall.Signal) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopLocked(sig)
}

func (v *service) stopLocked(sig syscall.Signal) {
	v.active = false
	stopGroup(v.cmd, v.exited, sig, 10*time.Second)
	v.cmd = nil
}

func (v *service) startLocked() error {
	h := v.s.h
	u, env, argv, logf, err := h.unitExec(v.name)
	if err != nil {
		return err
	}
	defer logf.Close()
	for key, dir := range map[string]string{"RuntimeDirectory": "/run/", "StateDirectory": "/var/lib/"} {
		if name := u.Settings[key]; name != "" {
			mode, err := strconv.ParseUint(cmp.Or(u.Settings[key+"Mode"], "0755"), 8, 32)
			if err != nil {
				return fmt.Errorf("%s: %sMode: %w", v.name, key, err)
			}
			if err := os.MkdirAll(h.Path(dir+name), os.FileMode(mode)); err != nil {
				return err
			}
		}
	}
	var notify *net.UnixConn
	if u.Settings["Type"] == "notify" {
		path := h.Path("/run/systemd/notify-" + v.name)
		_ = os.Remove(path)
		if notify, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"}); err != nil {
			return err
		}
		defer notify.Close()
		env = append(env, "NOTIFY_SOCKET="+path)
	}
	fmt.Fprintf(logf, "==== %s systemd: starting %s\n", time.Now().Format(time.RFC3339Nano), v.name)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	startedAt := time.Now()
	exited, err := startOnLockedThread(cmd)
	if err != nil {
		return err
	}
	v.cmd, v.exited, v.startedAt = cmd, exited, startedAt
	v.starts.Add(1)
	go v.supervise(u, cmd, exited)
	if notify != nil {
		// systemd's default TimeoutStartSec.
		if err := awaitReady(notify, exited, 90*time.Second); err != nil {
			v.logf("failed to start: %v", err)
			v.stopLocked(syscall.SIGKILL)
			return fmt.Errorf("%s: %w", v.name, err)
		}
	}
	return nil
}

// started is when the running process was started and its pid (0 when
// the unit is not running).
func (v *service) started() (time.Time, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd == nil {
		return time.Time{}, 0
	}
	return v.startedAt, v.cmd.Process.Pid
}

// awaitReady waits for READY=1 on the notify socket.
func awaitReady(notify *net.UnixConn, exited <-chan struct{}, within time.Duration) error {
	ready := make(chan error, 1)
	_ = notify.SetReadDeadline(time.Now().Add(within))
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				ready <- fmt.Errorf("no READY=1: %w", err)
				return
			}
			for _, l := range strings.Split(string(buf[:n]), "\n") {
				if l == "READY=1" {
					ready <- nil
					return
				}
			}
		}
	}()
	select {
	case err := <-ready:
		return err
	case <-exited:
		return errors.New("exited before READY=1")
	}
}

// supervise applies Restart= and RestartSec= when cmd exits without the
// stand-in having stopped it.
func (v *service) supervise(u *Unit, cmd *exec.Cmd, exited <-chan struct{}) {
	<-exited
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd != cmd || !v.active {
		return // stopped or replaced on purpose
	}
	v.cmd = nil
	failed := !cmd.ProcessState.Success()
	v.logf("exited: %s", cmd.ProcessState)
	restart := u.Settings["Restart"]
	if !(restart == "always" || restart == "on-failure" && failed) {
		v.active = false
		return
	}
	delay, err := restartSec(u.Settings["RestartSec"])
	if err != nil {
		v.logf("%v: not restarted", err)
		v.active = false
		return
	}
	v.logf("Restart=%s: starting again in %s", restart, delay)
	time.AfterFunc(delay, func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.active && v.cmd == nil {
			if err := v.startLocked(); err != nil {
				// A start that fails leaves the unit failed, as
				// systemd's start limit would after some tries.
				v.logf("restart failed: %v", err)
				v.active = false
			}
		}
	})
}

// logf appends one line about the unit to its log.
func (v *service) logf(format string, args ...any) {
	logf, err := os.OpenFile(v.s.h.Path("/var/log/"+strings.TrimSuffix(v.name, ".service")+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s systemd: %s %s\n", time.Now().Format(time.RFC3339Nano), v.name, fmt.Sprintf(format, args...))
}

// restartSec parses RestartSec= as systemd does for the forms units use:
// plain seconds ("1") or a duration ("500ms", "2s"); systemd's default is
// 100ms.
func restartSec(v string) (time.Duration, error) {
	if v == "" {
		return 100 * time.Millisecond, nil
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("RestartSec=%s: %w", v, err)
	}
	return d, nil
}

// reload runs the unit's ExecReload= lines with $MAINPID, as
// `systemctl reload` does, and fails when one fails.
func (v *service) reload() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd == nil {
		return fmt.Errorf("%s is not active, cannot reload", v.name)
	}
	u, env, _, logf, err := v.s.h.unitExec(v.name)
	if err != nil {
		return err
	}
	defer logf.Close()
	if len(u.ExecReload) == 0 {
		return fmt.Errorf("%s has no ExecReload=", v.name)
	}
	env = append(env, "MAINPID="+strconv.Itoa(v.cmd.Process.Pid))
	for _, line := range u.ExecReload {
		argv, ignore, err := Command(line, env)
		if err != nil {
			return err
		}
		fmt.Fprintf(logf, "==== %s systemd: ExecReload %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
		c := exec.Command(argv[0], argv[1:]...)
		c.Env, c.Stdout, c.Stderr = env, logf, logf
		if err := c.Run(); err != nil && !ignore {
			return fmt.Errorf("ExecReload %s: %w", argv[0], err)
		}
	}
	return nil
}
