// Package runner runs external commands for both binaries (confd's
// check_cmd and reload_cmd, kube-apiserver-safe-restart's restart command)
// with one set of rules: each command gets its own process group; a timeout
// or a cancelled context sends SIGTERM to the group and SIGKILL only after a
// grace period; exit status 0 is success even when a background child keeps
// an output pipe open; output is delivered line by line as it arrives, with
// private key material masked, and its tail is kept for error messages.
package runner

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/keysync/confd/internal/redact"
)

// Defaults for the zero values of Spec's tuning fields, and output limits.
const (
	DefaultGrace     = 10 * time.Second
	DefaultPipeDrain = 500 * time.Millisecond
	MaxDrainFactor   = 20
	// TailLines is how many of the last lines Result.Tail keeps.
	TailLines = 20
	// maxBuffered bounds what the pipes (up to 1 MiB each, see
	// F_SETPIPE_SZ) and our reader can hold when the command exits.
	maxBuffered = 2*(1<<20) + 2*MaxLine
	// MaxLine bounds one output line; the rest of a longer line is dropped
	// (and counted) so that a command printing megabytes without a newline
	// cannot make us hold them.
	MaxLine = 8 << 10
)

// Stream names where a line came from.
type Stream int

// The two output streams.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

// Spec describes one run.
type Spec struct {
	// Argv is run without a shell; use Shell for a /bin/sh -c command line.
	Argv []string
	// Name is how messages name the command; empty is Quote(Argv). (A
	// command run under a wrapper, such as a group guard, keeps its own.)
	Name string
	// ExtraFiles are passed to the command as descriptors 3, 4, ...; the
	// caller keeps (and closes) its copies.
	ExtraFiles []*os.File
	// ShareOutputReaders also passes the read ends of the command's output
	// pipes (stdout's, then stderr's unless CombinedOutput), after
	// ExtraFiles: for a group guard that keeps reading them once we are
	// gone, so that the command's output does not kill it with SIGPIPE
	// while it cleans up.
	ShareOutputReaders bool
	// Env is the complete environment of the command; nil inherits ours.
	Env []string
	// Timeout is how long the command may run before its process group gets
	// SIGTERM; zero means no timeout. It counts from Start.
	Timeout time.Duration
	// Grace is how long after SIGTERM (timeout, Terminate or a cancelled
	// context) the group gets SIGKILL. Zero means DefaultGrace.
	Grace time.Duration
	// OnExit, when set, is called with the process's pid as soon as it
	// has exited, before its output is drained: a group guard's owner
	// learns there whether the guard died and left its command unwatched.
	OnExit func(pid int)
	// PipeDrain is how long, after the command exited, we wait on an empty
	// output pipe that is still open (a background child inherited it)
	// before we stop delivering its output. What the pipes held is always
	// delivered first, however slow OnLine is; what a background child
	// keeps writing without such a pause is delivered for at most
	// MaxDrainFactor times PipeDrain. Zero means DefaultPipeDrain.
	PipeDrain time.Duration
	// OnLine receives every output line (without its newline, redacted,
	// at most MaxLine bytes) as it arrives. Calls are serialised.
	OnLine func(s Stream, line string)
	// Secrets, when set, are values whose base64 encodings are masked in
	// the output too (redact.Known), whatever the wrapping: the private
	// keys of the files the command is about.
	Secrets *redact.Secrets
	// Stdout and Stderr, when set, receive the same redacted lines with a
	// newline each, for callers that pass output through.
	Stdout, Stderr io.Writer
	// CombinedOutput sends stderr into the same pipe as stdout, so that
	// lines keep the order the command wrote them in (all are reported as
	// Stdout); for output that is read as one story, as in a log.
	CombinedOutput bool
	// ParentDeathSignal, when non-zero, is sent to the command by the kernel
	// if this process dies first (PR_SET_PDEATHSIG), so that a crashed
	// parent does not leave the command running unsupervised.
	ParentDeathSignal syscall.Signal
}

func (s *Spec) streams() []Stream {
	if s.CombinedOutput {
		return []Stream{Stdout}
	}
	return []Stream{Stdout, Stderr}
}

// Shell returns the argv that runs a command line under /bin/sh -c.
func Shell(cmdline string) []string { return []string{"/bin/sh", "-c", cmdline} }

// Result is how the command ended.
type Result struct {
	// ExitCode is the exit status, or -1 when it died of a signal or never ran.
	ExitCode int
	Signal   syscall.Signal
	TimedOut bool
	// Terminated is set when Terminate or the context ended the command
	// early. Exit status 0 within the grace still counts as success.
	Terminated bool
	// Killed is set when SIGTERM was not enough and the group got SIGKILL.
	Killed bool
	// Tail holds the last output lines (both streams, in arrival order).
	Tail []string
	// Dropped counts output lines that fell out of Tail.
	Dropped int
	// PipeHeld is set when output was still open after the command exited
	// (a background child holds it) and delivery stopped (see PipeDrain).
	PipeHeld bool
	// Err is set when the command did not succeed; it says why in words.
	Err error
}

// Process is a started command.
type Process struct {
	spec   Spec
	cmd    *exec.Cmd
	start  time.Time
	done   chan struct{}
	res    Result
	termMu sync.Mutex
	termed bool
	killed bool
	exited chan struct{}
	// startDone is closed once cmd.Start returned: the reading ends of the
	// pipes may be among the child's ExtraFiles (ShareOutputReaders), and
	// Start reads their descriptors, so a reader that met EOF early must
	// not close its end before then.
	startDone chan struct{}
	readers   sync.WaitGroup
	out       *collector
}

// Run starts the command and waits for it.
func Run(ctx context.Context, spec Spec) Result {
	p, err := Start(ctx, spec)
	if err != nil {
		return Result{ExitCode: -1, Err: err}
	}
	return p.Wait()
}

// Start starts the command. The timeout runs from here. When ctx ends before the command, the command is
// terminated as by Terminate(spec.Grace).
func Start(ctx context.Context, spec Spec) (*Process, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("empty command")
	}
	if spec.Grace <= 0 {
		spec.Grace = DefaultGrace
	}
	if spec.PipeDrain <= 0 {
		spec.PipeDrain = DefaultPipeDrain
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = spec.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: spec.ParentDeathSignal}
	// (A copy: the output pipes' read ends may join them, below.)
	cmd.ExtraFiles = slices.Clone(spec.ExtraFiles)
	if spec.Name == "" {
		spec.Name = Quote(spec.Argv)
	}
	p := &Process{spec: spec, cmd: cmd, done: make(chan struct{}),
		exited: make(chan struct{}), startDone: make(chan struct{}), out: &collector{spec: &spec}}
	// Our own pipes, not exec's copying goroutines: Wait must return when the
	// command exits, whoever else still holds the write ends.
	var childEnds []*os.File
	for _, s := range spec.streams() {
		r, w, err := os.Pipe()
		if err != nil {
			close(p.startDone) // nothing was started: readers may close
			closeAll(childEnds)
			return nil, fmt.Errorf("start %s: output pipe: %w", p.spec.Name, err)
		}
		childEnds = append(childEnds, w)
		p.out.pipes[s] = r
		if spec.ShareOutputReaders {
			cmd.ExtraFiles = append(cmd.ExtraFiles, r)
		}
		p.readers.Add(1)
		go p.read(s, r)
	}
	cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[len(childEnds)-1]
	started := make(chan error, 1)
	go p.run(started)
	err := <-started
	close(p.startDone)
	closeAll(childEnds)
	if err != nil {
		p.readers.Wait()
		return nil, fmt.Errorf("start %s: %w", p.spec.Name, err)
	}
	go p.supervise(ctx)
	return p, nil
}

// run starts and reaps the command on one goroutine. With a parent-death
// signal the goroutine stays locked to its OS thread until the command has
// exited: the kernel sends that signal when the *thread* that forked the
// child exits, and Go may otherwise retire the thread at any time.
func (p *Process) run(started chan<- error) {
	if p.spec.ParentDeathSignal != 0 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil
	_ = p.cmd.Wait()
	if p.spec.OnExit != nil {
		p.spec.OnExit(p.cmd.Process.Pid)
	}
	close(p.exited)
}

// supervise enforces the timeout and the context, then collects the result.
func (p *Process) supervise(ctx context.Context) {
	defer close(p.done)
	var timeout <-chan time.Time // a timer no longer referenced is collected (Go 1.23)
	if p.spec.Timeout > 0 {
		timeout = time.After(p.spec.Timeout - time.Since(p.start))
	}
	var timedOut bool
	select {
	case <-p.exited:
	case <-timeout:
		timedOut = true
	case <-ctx.Done():
	}
	if timedOut || ctx.Err() != nil {
		p.Terminate(p.spec.Grace)
		<-p.exited
	}
	p.termMu.Lock()
	terminated, killed := p.termed, p.killed
	if terminated {
		// Whatever is left of an ended group goes too: nobody waits for it.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	p.termMu.Unlock()
	r := Result{ExitCode: -1, TimedOut: timedOut, Terminated: terminated && !timedOut, Killed: killed, PipeHeld: p.drain()}
	p.out.mu.Lock()
	r.Tail, r.Dropped = slices.Clone(p.out.tailBuf), p.out.dropped
	p.out.mu.Unlock()
	if ps := p.cmd.ProcessState; ps != nil {
		r.ExitCode = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.Signal = ws.Signal()
		}
	}
	how := "its process group got SIGTERM"
	if killed {
		how = fmt.Sprintf("its process group got SIGTERM, then SIGKILL after %s grace", p.spec.Grace)
	}
	switch {
	case timedOut:
		r.Err = fmt.Errorf("%s did not finish within %s; %s", p.spec.Name, p.spec.Timeout, how)
	case r.Terminated && (r.Signal != 0 || r.ExitCode != 0):
		// A command that exits 0 in its grace finished its job: success.
		r.Err = fmt.Errorf("%s was stopped before it finished; %s", p.spec.Name, how)
	case r.Signal != 0:
		r.Err = fmt.Errorf("%s was killed by signal %s", p.spec.Name, r.Signal)
	case r.ExitCode != 0:
		r.Err = fmt.Errorf("%s exited with status %d", p.spec.Name, r.ExitCode)
	}
	p.res = r
}

// drain lets the readers deliver what the command wrote, then stops
// delivering lines from pipes a background child still holds. It reports
// whether it had to. The readers go on reading (and discarding) until that
// child closes the pipe: closing our end would kill it with SIGPIPE on its
// next write, and it may be the very service the command restarted.
func (p *Process) drain() bool {
	finished := make(chan struct{})
	go func() { p.readers.Wait(); close(finished) }()
	limit := time.Now().Add(MaxDrainFactor * p.spec.PipeDrain)
	atExit := p.out.bytesRead()
	tick := time.NewTicker(max(p.spec.PipeDrain/5, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-finished:
			return false
		case <-tick.C:
		}
		// Past maxBuffered bytes since the exit, someone else is writing.
		if p.out.idleFor(p.spec.PipeDrain) || (time.Now().After(limit) && p.out.bytesRead()-atExit > maxBuffered) {
			// Lines read from now on are discarded.
			p.out.mu.Lock()
			p.out.stopped = true
			p.out.mu.Unlock()
			return true
		}
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// Pid is the process (and process group) id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done closes when the command has ended and its result is ready.
func (p *Process) Done() <-chan struct{} { return p.done }

// Terminate ends the command early: SIGTERM to its process group now, then
// SIGKILL after grace if the command has not exited. It does not wait.
func (p *Process) Terminate(grace time.Duration) {
	p.termMu.Lock()
	defer p.termMu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	if p.termed {
		return
	}
	p.termed = true
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	time.AfterFunc(grace, func() {
		p.termMu.Lock()
		defer p.termMu.Unlock()
		select {
		case <-p.exited: // the group is no longer ours to kill
		default:
			p.killed = true
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	})
}

// Wait blocks until the command has ended and returns how.
func (p *Process) Wait() Result {
	<-p.done
	return p.res
}

// read splits one stream into lines, redacts each and hands it on.
func (p *Process) read(s Stream, f *os.File) {
	defer p.readers.Done()
	defer func() { <-p.startDone; _ = f.Close() }()
	defer p.out.readerDone(s)
	br := bufio.NewReaderSize(pipeReader{f: f, c: p.out, s: s}, MaxLine)
	var filter redact.Lines
	emit := func(text string) { p.out.line(s, text) }
	known := redact.NewKnown(p.spec.Secrets)
	toFilter := func(text string) { filter.Push(text, emit) }
	for {
		line, err := br.ReadSlice('\n')
		text := string(line)
		// Keep the head of an overlong line and count the rest (only the
		// last part, err nil, ends in the newline).
		cut := 0
		for errors.Is(err, bufio.ErrBufferFull) {
			var more []byte
			more, err = br.ReadSlice('\n')
			cut += len(bytes.TrimSuffix(more, []byte("\n")))
		}
		text = strings.TrimSuffix(strings.TrimSuffix(text, "\n"), "\r")
		if text != "" || len(line) > 0 {
			if cut > 0 {
				text += fmt.Sprintf(" [%d more bytes of this line dropped]", cut)
			}
			known.Push(text, toFilter)
		}
		if err != nil {
			// Lines of a base64 block are held until it ends: here.
			known.Flush(toFilter)
			filter.Flush(emit)
			return
		}
	}
}

// collector serialises line delivery and keeps the tail. Its arrays are
// indexed by Stream.
type collector struct {
	spec    *Spec
	mu      sync.Mutex
	tailBuf []string
	dropped int
	stopped bool
	read    int64        // bytes read from the pipes
	waiting [3]time.Time // since when a reader waits on an empty pipe; zero: it does not
	done    [3]bool      // readers that reached EOF
	pipes   [3]*os.File
}

// pipeReader tells the collector when its reader waits on an empty pipe:
// only then has everything written so far been delivered.
type pipeReader struct {
	f *os.File
	c *collector
	s Stream
}

func (r pipeReader) Read(b []byte) (int, error) {
	r.c.mu.Lock()
	r.c.waiting[r.s] = time.Now()
	r.c.mu.Unlock()
	n, err := r.f.Read(b)
	r.c.mu.Lock()
	r.c.waiting[r.s] = time.Time{}
	r.c.read += int64(n)
	r.c.mu.Unlock()
	return n, err
}

func (c *collector) readerDone(s Stream) {
	c.mu.Lock()
	c.done[s] = true
	c.mu.Unlock()
}

// idleFor reports whether every reader still running has waited on an
// empty pipe for at least d.
func (c *collector) idleFor(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := false
	for _, s := range c.spec.streams() {
		if c.done[s] {
			continue
		}
		live = true
		since := c.waiting[s]
		if since.IsZero() || time.Since(since) < d || pending(c.pipes[s]) {
			return false
		}
	}
	return live
}

// pending reports whether f still has bytes to read (TIOCINQ is FIONREAD
// on Linux): a reader slow to be scheduled must not pass for one waiting on
// an empty pipe.
func pending(f *os.File) bool {
	n := 0
	rc, err := f.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	}
	return err == nil && n > 0
}

func (c *collector) bytesRead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.read
}

func (c *collector) line(s Stream, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if c.spec.OnLine != nil {
		c.spec.OnLine(s, text)
	}
	w := c.spec.Stdout
	if s == Stderr {
		w = c.spec.Stderr
	}
	if w != nil {
		_, _ = io.WriteString(w, text+"\n")
	}
	if len(c.tailBuf) == TailLines {
		c.tailBuf = c.tailBuf[1:]
		c.dropped++
	}
	c.tailBuf = append(c.tailBuf, text)
}

// WithoutVars returns env without the variables named, for commands that
// must not see the parent's credentials.
func WithoutVars(env []string, names ...string) []string {
	// Never nil, even for a nil env: a nil Spec.Env inherits ours.
	return slices.DeleteFunc(append([]string{}, env...), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}

// Quote renders argv for messages, quoting words that need it. A /bin/sh -c
// command shows as its command line.
func Quote(argv []string) string {
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return quoteWord(argv[2])
	}
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = quoteWord(a)
	}
	return strings.Join(out, " ")
}

func quoteWord(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`;&|<>(){}*?[]#~") {
		return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return a
}
