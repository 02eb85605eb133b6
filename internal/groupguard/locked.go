package groupguard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/keysync/confd/internal/lockdir"
	"github.com/keysync/confd/internal/runner"
)

// Runner runs commands under a guard that, when this process dies, gives
// the command's group SIGTERM and, after the command's grace, SIGKILL
// (confd's check_cmd and reload_cmd: a helper such as
// kube-apiserver-safe-restart can still write its hold on SIGTERM).
//
// Each run also holds an flock on a file named after the command line (in
// LockDir), which the guard keeps until the command's group is gone. A
// process that starts after this one was SIGKILLed, and runs the same
// command (the reload it owes), waits for the old run to end instead of
// running beside it.
type Runner struct {
	// LockDir holds the lock files; empty runs without them.
	LockDir string
	// Waiting, when set, is told that a run waits for an earlier one.
	Waiting func(command string)
}

// Run is an apply.Runner.
func (r Runner) Run(ctx context.Context, spec runner.Spec) runner.Result {
	if spec.Name == "" {
		spec.Name = runner.Quote(spec.Argv)
	}
	if spec.Grace <= 0 {
		spec.Grace = runner.DefaultGrace
	}
	o := Options{Grace: spec.Grace}
	if r.LockDir != "" {
		lock, err := r.lock(ctx, spec)
		if err != nil {
			return runner.Result{ExitCode: -1, Err: fmt.Errorf("%s not run: %w", spec.Name, err)}
		}
		defer lock.Close()
		o.Lock = lock
	}
	p, w, err := Start(ctx, spec, o)
	if err != nil {
		return runner.Result{ExitCode: -1, Err: err}
	}
	res := p.Wait()
	if w.GroupAlive {
		// The guard died on its own (killed by someone): nothing watches
		// the command's group any more, so it goes now.
		res.Err = fmt.Errorf("%s: its group guard died and its process group could not be confirmed gone: %w", spec.Name, res.Err)
	}
	return res
}

// lock opens and flocks the command's lock file, waiting for ctx.
func (r Runner) lock(ctx context.Context, spec runner.Spec) (*os.File, error) {
	// Not a directory of someone else's: they could hold our locks.
	if err := lockdir.Ensure(r.LockDir); err != nil {
		return nil, fmt.Errorf("command lock directory: %w", err)
	}
	// Keyed by what the command runs for (confd's CONFD_RESOURCE: the
	// resource file, under its confdir) and the command line: the same
	// confd restarted waits for its old run, another confd does not. (The
	// empty field between was a working directory: lock names stay those
	// of earlier releases.)
	sum := sha256.Sum256([]byte(resourceOf(spec.Env) + "\x00\x00" + spec.Name))
	path := filepath.Join(r.LockDir, hex.EncodeToString(sum[:12])+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("command lock: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		if r.Waiting != nil {
			r.Waiting(spec.Name)
		}
		got := make(chan error, 1)
		go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
		select {
		case err = <-got:
		case <-ctx.Done():
			// The blocked flock ends when the earlier run does; the file
			// is closed (and the lock let go) then.
			go func() { <-got; _ = f.Close() }()
			return nil, ctx.Err()
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("command lock %s: %w", path, err)
	}
	return f, nil
}

// resourceOf is the resource a command's environment names, if any.
func resourceOf(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CONFD_RESOURCE="); ok {
			return v
		}
	}
	return ""
}
