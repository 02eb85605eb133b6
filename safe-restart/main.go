// Command kube-apiserver-safe-restart restarts kube-apiserver on one control
// plane host at a time: it checks the files the new apiserver will read,
// takes an etcd lock shared with `etcdctl lock`, restarts, holds the lock
// until the apiserver is ready, and stops every host from restarting (a
// "hold" in etcd) when a restart fails. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Version is stamped by the Makefile (-ldflags "-X main.Version=...", the
// same variable name as confd's), so both binaries report one version.
var Version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
