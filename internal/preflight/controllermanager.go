package preflight

import (
	"fmt"

	"github.com/keysync/confd/internal/trust"
)

// ControllerManagerKey is the --service-account-private-key-file that
// kube-controller-manager's flags files (flags file, EnvironmentFile or
// static-pod manifest, read as the apiserver's are) name, with the key ID
// of the one key in that file: the key kube-controller-manager signs legacy
// token Secrets with. Both are "" when flagsFiles is empty or names no such
// flag. kube-apiserver-safe-restart (its trust record, rotate-key's
// restart) and kube-apiserver-sa-signer (its trust record) read the
// controller-manager through this one function.
func ControllerManagerKey(flagsFiles []string) (file, kid string, err error) {
	specs := map[string]flagSpec{"service-account-private-key-file": {role: roleSigningKey}}
	occ, err := readFlags(flagsFiles, specs)
	if err != nil {
		return "", "", err
	}
	for _, o := range occ {
		file = o.value
	}
	if file == "" {
		return "", "", nil
	}
	kids, err := trust.FileKeyIDs(file)
	if err != nil {
		return file, "", fmt.Errorf("kube-controller-manager's --service-account-private-key-file: %w", err)
	}
	if len(kids) != 1 {
		return file, "", fmt.Errorf("kube-controller-manager's --service-account-private-key-file %s holds %d keys, want 1", file, len(kids))
	}
	return file, kids[0], nil
}
