package resource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/keysync/confd/internal/redact"
)

// maxOutput bounds what a chatty command can make us keep in memory.
const maxOutput = 64 << 10

// expandCommand fills {{.src}} and {{.dest}} in a check_cmd or reload_cmd.
func expandCommand(name, cmd, src, dest string) (string, error) {
	if cmd == "" {
		return "", nil
	}
	t, err := template.New(name).Option("missingkey=error").Parse(cmd)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, map[string]string{"src": src, "dest": dest}); err != nil {
		return "", err
	}
	return b.String(), nil
}

// CommandError reports a command that failed, timed out or could not start.
type CommandError struct {
	Command  string
	Err      error
	Output   string
	TimedOut bool
	Timeout  time.Duration
}

func (e *CommandError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%q ", e.Command)
	if e.TimedOut {
		fmt.Fprintf(&b, "killed after timeout %s", e.Timeout)
	} else {
		b.WriteString(e.Err.Error())
	}
	if out := strings.TrimSpace(e.Output); out != "" {
		fmt.Fprintf(&b, ": %s", lastLines(out, 5))
	}
	return b.String()
}

func (e *CommandError) Unwrap() error { return e.Err }

// runCommand runs cmd under /bin/sh -c in its own process group, so that a
// timeout kills the shell and everything it started, not just the shell.
func runCommand(ctx context.Context, cmd string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := exec.CommandContext(ctx, "/bin/sh", "-c", cmd)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	// A grandchild that keeps stdout open must not hold us past the kill.
	c.WaitDelay = 2 * time.Second
	out := &cappedBuffer{max: maxOutput}
	c.Stdout, c.Stderr = out, out
	err := c.Run()
	// Output goes to logs and errors: a check that echoes the staged file
	// must not put a private key there.
	output := redact.String(out.String())
	if err == nil {
		return output, nil
	}
	ce := &CommandError{Command: cmd, Err: err, Output: output, Timeout: timeout}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		ce.TimedOut = true
	}
	return output, ce
}

type cappedBuffer struct {
	b   bytes.Buffer
	max int
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.b.Len(); room > 0 {
		if len(p) > room {
			c.b.Write(p[:room])
		} else {
			c.b.Write(p)
		}
	}
	return len(p), nil
}

func (c *cappedBuffer) String() string { return c.b.String() }

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
