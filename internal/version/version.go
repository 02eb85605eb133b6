// Package version holds the release version of the module's three
// binaries. The Makefile stamps it with -ldflags "-X
// github.com/keysync/confd/internal/version.Version=...", so confd,
// kube-apiserver-safe-restart and kube-apiserver-sa-signer built together
// report the same version.
package version

// Version is the release version; "dev" when built without the Makefile.
var Version = "dev"
