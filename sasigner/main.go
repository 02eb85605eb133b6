// Package sasigner is the command line of kube-apiserver-sa-signer,
// kube-apiserver's external
// service-account token signer (--service-account-signing-endpoint): it
// signs with this master's key and serves every key the masters publish in
// etcd as verification keys, so key changes need no apiserver restart.
// See docs/signer.md.
package sasigner

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Main runs the command with os.Args and returns its exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return run(ctx, os.Args[1:], os.LookupEnv, hup, os.Stdout, os.Stderr)
}
