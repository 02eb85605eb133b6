package preflight

import "maps"

// ServiceAccountFiles returns the files a kube-apiserver started with the
// given flags files reads its service-account keys from: every
// --service-account-key-file in order, and the last
// --service-account-signing-key-file ("" when absent). The trust record of
// a restart is computed from exactly these files.
func ServiceAccountFiles(flagsFiles []string) (keyFiles []string, signingKey string, err error) {
	specs := apiserverFlags()
	maps.DeleteFunc(specs, func(_ string, s flagSpec) bool { return s.role != roleSAKey && s.role != roleSigningKey })
	occ, err := readFlags(flagsFiles, specs)
	if err != nil {
		return nil, "", err
	}
	for _, o := range occ {
		switch specs[o.flag].role {
		case roleSAKey:
			keyFiles = append(keyFiles, o.value)
		case roleSigningKey:
			signingKey = o.value
		}
	}
	return keyFiles, signingKey, nil
}
