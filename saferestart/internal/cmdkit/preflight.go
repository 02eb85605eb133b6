package cmdkit

import (
	"cmp"
	"time"

	"github.com/keysync/confd/internal/preflight"
)

// PreflightInput is what restart, rotate-key and check preflight. On a
// signer host the apiserver's flags name --service-account-signing-endpoint
// instead of key files; preflight then asks the signer for its keys and
// looks there for --signing-key's public half (by default the file the
// signer itself signs with, /etc/kubernetes/pki/sa.key).
func PreflightInput(o Preflight, signingKey string, warn func(error)) preflight.Input {
	return preflight.Input{Files: o.PreflightFiles, FlagsFiles: o.PreflightFlagsFiles, Now: time.Now(), SigningKey: cmp.Or(signingKey, DefaultSigningKey), Warn: warn}
}
