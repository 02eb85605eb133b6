package trust

import (
	"fmt"

	"github.com/keysync/confd/internal/preflight"
)

// ControllerManagerKey reads kube-controller-manager's flags files (flags
// file, EnvironmentFile or static-pod manifest) and returns the
// --service-account-private-key-file they name and the key ID of the key
// in it: the key it signs legacy token Secrets with. Both are "" when the
// files name no such flag. Shared by kube-apiserver-safe-restart (trust
// record, rotate-key's restart) and kube-apiserver-sa-signer (its trust
// record), so that both read the controller-manager the same way.
func ControllerManagerKey(flagsFiles []string) (file, kid string, err error) {
	if len(flagsFiles) == 0 {
		return "", "", nil
	}
	file, err = preflight.ControllerManagerKeyFile(flagsFiles)
	if err != nil || file == "" {
		return "", "", err
	}
	kids, err := FileKeyIDs(file)
	if err != nil {
		return file, "", fmt.Errorf("kube-controller-manager's --service-account-private-key-file: %w", err)
	}
	if len(kids) != 1 {
		return file, "", fmt.Errorf("kube-controller-manager's --service-account-private-key-file %s holds %d keys, want 1", file, len(kids))
	}
	return file, kids[0], nil
}
