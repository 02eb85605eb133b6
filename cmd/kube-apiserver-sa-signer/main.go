// Command kube-apiserver-sa-signer is kube-apiserver's external
// service-account token signer (--service-account-signing-endpoint). See
// docs/signer.md.
package main

import (
	"os"

	"github.com/keysync/confd/sasigner"
)

func main() { os.Exit(sasigner.Main()) }
