package preflight

import "errors"

// ControllerManagerKeyFile is the --service-account-private-key-file that
// kube-controller-manager's flags files (flags file, EnvironmentFile or
// static-pod manifest, read as the apiserver's are) name: the key it signs
// legacy token Secrets with. "" when none names one.
func ControllerManagerKeyFile(flagsFiles []string) (string, error) {
	specs := map[string]flagSpec{"service-account-private-key-file": {role: roleSigningKey}}
	occ, errs := readFlags(flagsFiles, specs)
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	path := ""
	for _, o := range effective(occ, specs) {
		path = o.value
	}
	return path, nil
}
