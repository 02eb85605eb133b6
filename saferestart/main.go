// Package saferestart is kube-apiserver-safe-restart's command line: it restarts kube-apiserver on one control
// plane host at a time: it checks the files the new apiserver will read,
// takes an etcd lock shared with `etcdctl lock`, restarts, holds the lock
// until the apiserver is ready, and stops every host from restarting (a
// "hold" in etcd) when a restart fails. See README.md.
package saferestart

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/keysync/confd/internal/groupguard"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
)

// Main runs the command with os.Args and returns its exit code.
func Main() int {
	// This binary is the restart command's group guard (internal/groupguard,
	// shared with confd): each restart attempt runs under it once the lock
	// is held, and when the helper dies it ends the command's whole group:
	// the lock is the helper's, and the next host must not restart beside
	// this one.
	if len(os.Args) > 1 && os.Args[1] == groupguard.Arg {
		return groupguard.Main(cmdkit.ProgName, os.Args[2:])
	}
	if len(os.Args) > 1 && os.Args[1] == restartcmd.StaticPodArg {
		return restartcmd.StaticPodMain(os.Args[2:])
	}
	ctx, force, stop := signals()
	defer stop()
	return runWith(ctx, force, os.Args[1:], os.Stdout, os.Stderr, nil)
}

// signals turns the first SIGTERM, SIGINT, SIGHUP or SIGQUIT into a
// cancelled context (stop as soon as it is safe: a terminal hang-up or a
// supervisor's quit is no reason to leave a restart half-done) and a
// second one into force (stop the command now).
func signals() (context.Context, <-chan struct{}, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	force := make(chan struct{})
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	done := make(chan struct{})
	go func() {
		for _, act := range []func(){cancel, func() { close(force) }} {
			select {
			case <-ch:
				act()
			case <-done:
				return
			}
		}
	}()
	return ctx, force, func() { signal.Stop(ch); close(done); cancel() }
}
