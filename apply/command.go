package apply

import (
	"context"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/logfmt"
	"github.com/keysync/confd/internal/redact"
	"github.com/keysync/confd/internal/runner"
)

// Runner runs one command; runner.Run is the real one.
type Runner func(ctx context.Context, spec runner.Spec) runner.Result

// errorTailLines is how much of a failed command's output its error shows.
const errorTailLines = 5

// CommandError reports a command that failed, timed out, was stopped or
// could not start. Its output tail is already redacted.
type CommandError struct {
	Command string
	Result  runner.Result
}

func (e *CommandError) Error() string {
	msg := e.Result.Err.Error()
	if tail := e.Result.Tail; len(tail) > 0 {
		msg += "; last output: " + strings.Join(tail[max(0, len(tail)-errorTailLines):], " | ")
	}
	return msg
}

func (e *CommandError) Unwrap() error { return e.Result.Err }

// maxLoggedLines bounds how many output lines of one command are logged as
// they arrive; beyond it only the last lines are, when the command ends, so
// that a command printing megabytes cannot flood the log.
const maxLoggedLines = 1000

// maxSecretsFile bounds how much of a file commandSecrets reads.
const maxSecretsFile = 16 << 20

// commandSecrets are the private keys in the files a command is about (the
// staged file, the live one), whose base64 encodings are masked in its
// output at any offset and wrapping (redact.Known); nil if there are none.
// A file that cannot be read adds none.
func commandSecrets(paths ...string) *redact.Secrets {
	var vals [][]byte
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(f, maxSecretsFile))
		_ = f.Close()
		vals = append(vals, redact.KeySecrets(b)...)
	}
	return redact.NewSecrets(vals...)
}

// runCommand runs one check_cmd or reload_cmd under /bin/sh -c, logging
// each output line as it arrives through logLine; the private keys of
// files (see commandSecrets) are masked in it in every base64 shape.
func (r *File) runCommand(ctx context.Context, kind, cmd string, timeout time.Duration, files []string, logLine func(string, ...interface{}), log logrus.FieldLogger) error {
	lines := 0
	run := r.s.Runner
	if run == nil {
		run = runner.Run
	}
	res := run(ctx, runner.Spec{
		Argv:    runner.Shell(cmd),
		Secrets: commandSecrets(files...),
		Env:     logfmt.ChildEnv(r.s.CommandEnv, r.File),
		Timeout: timeout,
		Grace:   r.s.CommandGrace,
		// One pipe: the log shows the lines in the order they were written.
		CombinedOutput: true,
		// One log record per line, whatever the line holds: quoted
		// unless it is printable (a helper's own log line stays one
		// plain line, not a line re-quoted inside ours).
		OnLine: func(_ runner.Stream, l string) {
			if lines++; lines <= maxLoggedLines {
				logLine("%s output: %s", kind, logfmt.Printable(l))
			}
		},
	})
	if skipped := lines - maxLoggedLines; skipped > 0 {
		n := min(skipped, len(res.Tail))
		logLine("%s: %d more output lines not logged; the last %d follow", kind, skipped-n, n)
		for _, l := range res.Tail[len(res.Tail)-n:] {
			logLine("%s output: %s", kind, logfmt.Printable(l))
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
