// Command kube-apiserver-sa-signer is kube-apiserver's external
// service-account token signer (--service-account-signing-endpoint): it
// signs with this master's key and serves every key the masters publish in
// etcd as verification keys, so key changes need no apiserver restart.
// See docs/signer.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Version is stamped by the Makefile, as for the other binaries.
var Version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], os.LookupEnv, hup, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
