// Command kube-apiserver-safe-restart restarts kube-apiserver on one control
// plane host at a time under an etcd lock shared with `etcdctl lock`, and
// publishes, rotates and retires the service-account keys the masters
// trust. See docs/safe-restart.md.
package main

import (
	"os"

	"github.com/keysync/confd/saferestart"
)

func main() { os.Exit(saferestart.Main()) }
