package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/keysync/confd/bench/launch"
)

// Peak RSS comes from wait4's rusage, but Linux folds into a process's
// ru_maxrss the high-water mark of the memory it execs from, and Go starts
// children with vfork: a child of the harness would report at least the
// harness's own peak (tens of MB after loading 100k keys). So every
// measured process is started by bench/launcher, a separate small program
// built at start-up, whose own few MB are the floor of every figure (the
// table's "true" row shows it).

type launchReq = launch.Request
type launchEvent = launch.Event

// launcher is the harness's side of one launcher process.
type launcher struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	mu   sync.Mutex
	next int
	subs map[int]chan launchEvent
}

// startLauncher builds bench/launcher from the module at root into dir and
// starts it.
func startLauncher(root, dir string) (*launcher, error) {
	bin := filepath.Join(dir, "launcher")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./bench/launcher")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./bench/launcher: %w\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &launcher{cmd: cmd, in: in, subs: map[int]chan launchEvent{}}
	go func() {
		dec := json.NewDecoder(outp)
		for {
			var ev launchEvent
			if err := dec.Decode(&ev); err != nil {
				l.mu.Lock()
				for id, ch := range l.subs {
					ch <- launchEvent{ID: id, Exited: true, Err: "launcher ended: " + err.Error()}
				}
				l.subs = map[int]chan launchEvent{}
				l.mu.Unlock()
				return
			}
			l.mu.Lock()
			ch := l.subs[ev.ID]
			if ev.Exited {
				delete(l.subs, ev.ID)
			}
			l.mu.Unlock()
			if ch != nil {
				ch <- ev
			}
		}
	}()
	return l, nil
}

// launched is one process started through the launcher.
type launched struct {
	pid    int
	events chan launchEvent
	exit   *launchEvent
}

func (l *launcher) start(output string, argv ...string) (*launched, error) {
	l.mu.Lock()
	l.next++
	id := l.next
	ch := make(chan launchEvent, 2)
	l.subs[id] = ch
	b, _ := json.Marshal(launchReq{ID: id, Argv: argv, Output: output})
	_, err := l.in.Write(append(b, '\n'))
	l.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("launcher: %w", err)
	}
	ev := <-ch
	p := &launched{pid: ev.Pid, events: ch}
	if ev.Exited {
		p.exit = &ev
		return p, fmt.Errorf("start %s: %s", argv[0], ev.Err)
	}
	return p, nil
}

// wait returns the process's exit, within d (0: no limit).
func (p *launched) wait(d time.Duration) (launchEvent, bool) {
	if p.exit != nil {
		return *p.exit, true
	}
	var timeout <-chan time.Time
	if d > 0 {
		timeout = time.After(d)
	}
	select {
	case ev := <-p.events:
		p.exit = &ev
		return ev, true
	case <-timeout:
		return launchEvent{}, false
	}
}

func (l *launcher) close() {
	_ = l.in.Close()
	_ = l.cmd.Wait()
}
