package apply

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/runner"
)

// Runner runs one command; runner.Run is the real one.
type Runner interface {
	Run(ctx context.Context, spec runner.Spec) runner.Result
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, spec runner.Spec) runner.Result

// Run implements Runner.
func (f RunnerFunc) Run(ctx context.Context, spec runner.Spec) runner.Result { return f(ctx, spec) }

// errorTailLines is how much of a failed command's output its error shows.
const errorTailLines = 5

// CommandError reports a command that failed, timed out, was stopped or
// could not start. Its output tail is already redacted.
type CommandError struct {
	Command string
	Result  runner.Result
}

func (e *CommandError) Error() string {
	var b strings.Builder
	b.WriteString(e.Result.Err.Error())
	if tail := e.Result.Tail; len(tail) > 0 {
		if len(tail) > errorTailLines {
			tail = tail[len(tail)-errorTailLines:]
		}
		fmt.Fprintf(&b, "; last output: %s", strings.Join(tail, " | "))
	}
	return b.String()
}

func (e *CommandError) Unwrap() error { return e.Result.Err }

// maxLoggedLines bounds how many output lines of one command are logged as
// they arrive; beyond it only the last lines are, when the command ends, so
// that a command printing megabytes cannot flood the log.
const maxLoggedLines = 1000

// runCommand runs one check_cmd or reload_cmd under /bin/sh -c, logging
// each output line as it arrives through logLine.
func (r *File) runCommand(ctx context.Context, kind, cmd string, timeout time.Duration, logLine func(string, ...interface{}), log logrus.FieldLogger) error {
	lines := 0
	res := r.s.runner().Run(ctx, runner.Spec{
		Argv:    runner.Shell(cmd),
		Env:     r.s.CommandEnv,
		Timeout: timeout,
		Grace:   r.s.CommandGrace,
		// One pipe: the log shows the lines in the order they were written.
		CombinedOutput: true,
		// %q: one log record per line, whatever the line holds, as confd
		// 0.16 quoted its command output.
		OnLine: func(_ runner.Stream, l string) {
			if lines++; lines <= maxLoggedLines {
				logLine("%s output: %q", kind, l)
			}
		},
	})
	if skipped := lines - maxLoggedLines; skipped > 0 {
		n := min(skipped, len(res.Tail))
		logLine("%s output: %d more lines not logged; the last %d follow", kind, skipped-n, n)
		for _, l := range res.Tail[len(res.Tail)-n:] {
			logLine("%s output: %q", kind, l)
		}
	}
	if res.PipeHeld {
		log.Debugf("%s exited; a background process it started still holds its output, which is no longer read", kind)
	}
	if res.Err != nil {
		return &CommandError{Command: cmd, Result: res}
	}
	return nil
}
