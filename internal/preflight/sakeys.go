package preflight

import (
	"errors"
)

// ServiceAccountFiles returns the files a kube-apiserver started with the
// given flags files reads its service-account keys from: every
// --service-account-key-file in order, and the last
// --service-account-signing-key-file ("" when absent). The trust record of
// a restart is computed from exactly these files.
func ServiceAccountFiles(flagsFiles []string) (keyFiles []string, signingKey string, err error) {
	specs := map[string]flagSpec{}
	for name, s := range apiserverFlags() {
		if s.role == roleSAKey || s.role == roleSigningKey {
			specs[name] = s
		}
	}
	occ, errs := readFlags(flagsFiles, specs)
	if len(errs) > 0 {
		return nil, "", errors.Join(errs...)
	}
	for _, o := range effective(occ, specs) {
		switch specs[o.flag].role {
		case roleSAKey:
			keyFiles = append(keyFiles, o.value)
		case roleSigningKey:
			signingKey = o.value
		}
	}
	return keyFiles, signingKey, nil
}
