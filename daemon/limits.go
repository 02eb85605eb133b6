package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/internal/runner"
)

// DefaultMaxCommands is -max-commands' default.
const DefaultMaxCommands = 4

// maxParallel is how many passes read, render and write at once. What a
// pass mostly does is wait (on etcd, on fsync), so at start-up with 1,000
// resources the waits overlap instead of adding up; the bound keeps as
// many reads in memory at once. A pass gives its slot back while one of its
// commands runs (Limits.Runner): a reload that takes 30 minutes holds a
// command slot, never a pass slot.
const maxParallel = 8

// Limits bounds what runs at once across groups: passes (reads, renders,
// writes) and check_cmd/reload_cmd commands (-max-commands), so that a
// resync of 1,000 resources never forks 1,000 reloads. One Limits serves
// a confd process: its resources' Runner and the daemon share it.
type Limits struct {
	passes   chan struct{}
	commands chan struct{}
	stop     <-chan struct{}
	log      logrus.FieldLogger
}

// NewLimits allows maxCommands commands at once (at least one). A command
// waiting for its turn gives up, unstarted, when stop closes (confd's
// first SIGTERM: no new command starts); nil never closes.
func NewLimits(maxCommands int, stop <-chan struct{}, log logrus.FieldLogger) *Limits {
	return &Limits{passes: make(chan struct{}, maxParallel), commands: make(chan struct{}, max(maxCommands, 1)),
		stop: stop, log: log}
}

// passKey marks a pass's context with the Limits whose pass slot it holds.
type passKey struct{}

// pass waits for a pass slot; false when ctx ended first. The returned
// context (under cmds, the commands' context) tells l.Runner that the
// caller holds a slot it may lend while a command runs.
func (l *Limits) pass(ctx, cmds context.Context) (context.Context, func(), bool) {
	select {
	case l.passes <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, false
	}
	return context.WithValue(cmds, passKey{}, l), func() { <-l.passes }, true
}

// errStopping: a command waited for its turn until confd began to stop.
var errStopping = errors.New("not started: confd is stopping")

// Runner runs next's commands (nil: the real runner) no more than the
// limit at once. A pass that runs one gives back its pass slot for the
// command's time and takes it back after, in that order, so that neither
// kind of slot is held while the other is awaited. A command's timeout
// counts from when it starts, not from when it began to wait.
func (l *Limits) Runner(next apply.Runner) apply.Runner {
	if next == nil {
		next = runner.Run
	}
	return func(ctx context.Context, spec runner.Spec) runner.Result {
		if holder, _ := ctx.Value(passKey{}).(*Limits); holder == l {
			<-l.passes
			defer func() { l.passes <- struct{}{} }()
		}
		select {
		case l.commands <- struct{}{}:
		default:
			// All slots taken: said when the wait begins and when it
			// ends, without the command line, which may carry a secret.
			began := time.Now()
			l.log.Infof("A command waits for its turn: %d commands run (-max-commands)", cap(l.commands))
			select {
			case l.commands <- struct{}{}:
				l.log.Infof("A command starts after waiting %s for its turn (-max-commands)", time.Since(began).Round(time.Millisecond))
			case <-ctx.Done():
				return runner.Result{ExitCode: -1, Err: fmt.Errorf("not started: %w", ctx.Err())}
			case <-l.stop:
				return runner.Result{ExitCode: -1, Err: errStopping}
			}
		}
		defer func() { <-l.commands }()
		return next(ctx, spec)
	}
}
