package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// run is one finished process: its wall time from start to exit and the
// peak resident set the kernel reports for it through wait4.
type run struct {
	wall   time.Duration
	maxRSS int64 // bytes
}

// runOnce runs argv to completion through the launcher; output, when not
// empty, is the file its stdout and stderr go to.
func (l *launcher) runOnce(ctx context.Context, output string, argv ...string) (run, error) {
	p, err := l.start(output, argv...)
	if err != nil {
		return run{}, err
	}
	for {
		ev, ok := p.wait(100 * time.Millisecond)
		if ok {
			r := run{wall: time.Duration(ev.WallNs), maxRSS: ev.MaxRSS}
			if ev.Err != "" {
				return r, fmt.Errorf("%s: %s\n%s", strings.Join(argv, " "), ev.Err, ev.Output)
			}
			return r, nil
		}
		if ctx.Err() != nil {
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	}
}

// daemon is a long-running process (confd -watch) under measurement.
type daemon struct {
	p   *launched
	log string
}

func (l *launcher) startDaemon(log string, argv ...string) (*daemon, error) {
	p, err := l.start(log, argv...)
	if err != nil {
		return nil, err
	}
	return &daemon{p: p, log: log}, nil
}

func (d *daemon) pid() int { return d.p.pid }

// output is the end of what the daemon logged so far.
func (d *daemon) output() string {
	b, _ := os.ReadFile(d.log)
	return tail(string(b))
}

// stop ends the daemon (TERM, then KILL) and returns its peak RSS.
func (d *daemon) stop() int64 {
	_ = syscall.Kill(-d.p.pid, syscall.SIGTERM)
	ev, ok := d.p.wait(5 * time.Second)
	if !ok {
		_ = syscall.Kill(-d.p.pid, syscall.SIGKILL)
		ev, _ = d.p.wait(0)
	}
	return ev.MaxRSS
}

// cpuTicks is the process's user+system CPU time in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which may hold spaces, in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s, nil
}

// procStatus returns a field of /proc/PID/status ("VmRSS", "Threads").
func procStatus(pid int, field string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// fileWatch reports files renamed or written into one directory, so a
// measurement sees a rendered file the moment it lands, without polling.
type fileWatch struct {
	fd, wd int
	dir    string
	read   string // the file whose content each of its events carries
	events chan fileEvent
	closed atomic.Bool
}

type fileEvent struct {
	name string
	at   time.Time
	// content is the file's, read right after the event when name is the
	// file watchDir was asked to read (ok): read later, when the event is
	// taken from the channel, a burst's events would all show its last
	// write.
	content []byte
	ok      bool
}

// watchDir watches dir; the events of the file named read ("" for none)
// carry its content.
func watchDir(dir, read string) (*fileWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	wd, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify %s: %w", dir, err)
	}
	w := &fileWatch{fd: fd, wd: wd, dir: dir, read: read, events: make(chan fileEvent, 65536)}
	go w.loop()
	return w, nil
}

// loop reads events until close. It alone closes the descriptor, after its
// last read: closing it under a blocked read would let that read's next
// call land on whatever descriptor reuses the number (another watch's).
func (w *fileWatch) loop() {
	defer close(w.events)
	defer unix.Close(w.fd)
	buf := make([]byte, 64*1024)
	for !w.closed.Load() {
		n, err := unix.Read(w.fd, buf)
		if err != nil || n <= 0 {
			if err == unix.EINTR {
				continue
			}
			return
		}
		at := time.Now()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameb := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := string(bytes.TrimRight(nameb, "\x00"))
			fe := fileEvent{name: name, at: at}
			if name == w.read && w.read != "" {
				if b, err := os.ReadFile(filepath.Join(w.dir, name)); err == nil {
					fe.content, fe.ok = b, true
				}
			}
			if !w.closed.Load() {
				select {
				case w.events <- fe:
				default: // nobody reads any more, or far behind: drop
				}
			}
		}
	}
}

// close ends loop: removing the watch queues IN_IGNORED, which wakes its read.
func (w *fileWatch) close() {
	w.closed.Store(true)
	_, _ = unix.InotifyRmWatch(w.fd, uint32(w.wd))
}

// waitContent waits until file name in the watched directory holds want,
// and returns when it was seen. Events from before since are not counted:
// the file read then may already hold a newer write, whose own event is
// still queued.
func (w *fileWatch) waitContent(name, want string, since time.Time, within time.Duration) (time.Time, error) {
	path := filepath.Join(w.dir, name)
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return time.Time{}, fmt.Errorf("inotify on %s closed", w.dir)
			}
			if ev.name != name || ev.at.Before(since) {
				continue
			}
			if b, err := os.ReadFile(path); err == nil && string(b) == want {
				return ev.at, nil
			}
		case <-timeout:
			b, _ := os.ReadFile(path)
			return time.Time{}, fmt.Errorf("%s did not become %q within %s (holds %q)", path, want, within, b)
		}
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}
