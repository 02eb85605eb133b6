// Package launch is the protocol between the benchmark harness and its
// launcher: a small process that starts the measured programs, so that
// the peak RSS wait4 reports for them is theirs and not the harness's.
package launch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Request starts one process.
type Request struct {
	ID     int      `json:"id"`
	Argv   []string `json:"argv"`
	Output string   `json:"output,omitempty"` // file for stdout and stderr; empty: kept, tail returned
}

// Event reports a process started (Pid) or exited (Exited and the rest).
type Event struct {
	ID     int    `json:"id"`
	Pid    int    `json:"pid,omitempty"`
	Exited bool   `json:"exited,omitempty"`
	WallNs int64  `json:"wall_ns,omitempty"` // start to exit, measured here
	MaxRSS int64  `json:"max_rss,omitempty"` // bytes, from wait4
	Err    string `json:"err,omitempty"`
	Output string `json:"output,omitempty"`
}

// Serve starts the processes requested on in, one JSON Request a line,
// and reports on out, one JSON Event a line, when each started and how it
// exited, until in ends.
func Serve(in io.Reader, out io.Writer) {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	send := func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(ev)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			continue
		}
		cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
		var out bytes.Buffer
		cmd.Stderr = &out
		cmd.Stdout = &out
		var f *os.File
		if req.Output != "" {
			var err error
			if f, err = os.OpenFile(req.Output, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err != nil {
				send(Event{ID: req.ID, Exited: true, Err: err.Error()})
				continue
			}
			cmd.Stdout, cmd.Stderr = f, f
		}
		// Its own group, so that the harness can stop it and its children.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			if f != nil {
				f.Close()
			}
			send(Event{ID: req.ID, Exited: true, Err: err.Error()})
			continue
		}
		send(Event{ID: req.ID, Pid: cmd.Process.Pid})
		go func() {
			err := cmd.Wait()
			if f != nil {
				f.Close()
			}
			ev := Event{ID: req.ID, Exited: true, WallNs: int64(time.Since(start)), MaxRSS: maxRSS(cmd.ProcessState), Output: tail(out.String())}
			if err != nil {
				ev.Err = err.Error()
			}
			send(ev)
		}()
	}
}

func maxRSS(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss * 1024 // Linux reports KiB
	}
	return 0
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}
