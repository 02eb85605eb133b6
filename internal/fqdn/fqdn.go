// Package fqdn names this host as the example publisher
// (sa-key-publish.service) writes its published key: the output of
// `hostname -f`. kube-apiserver-safe-restart and kube-apiserver-sa-signer
// both name the host's trust record so, so that it matches the key the
// host publishes.
package fqdn

import (
	"context"
	"os/exec"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// Timeout bounds `hostname -f` (a wait of the worst case).
const Timeout = 5 * time.Second

// Lookup returns the output of `hostname -f`. When it fails or prints
// nothing it returns fallback (the caller's kernel host name), with a
// warning: a host without a resolvable FQDN stays usable, but its records
// would not match what it publishes unless --host says so.
func Lookup(ctx context.Context, log logrus.FieldLogger, fallback string) string {
	cctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	out, err := exec.CommandContext(cctx, "hostname", "-f").Output()
	if name := strings.TrimSpace(string(out)); err == nil && name != "" {
		return name
	}
	log.WithError(err).Warnf("`hostname -f` failed: using %q as this host's name; pass --host to match what the publisher writes", fallback)
	return fallback
}
