package saferestart

import (
	"time"

	"github.com/keysync/confd/internal/preflight"
)

// preflightInput is what restart, rotate-key and check preflight. On a
// signer host the apiserver's flags name --service-account-signing-endpoint
// instead of key files; preflight then asks the signer for its keys and
// looks there for --signing-key's public half (by default the file the
// signer itself signs with, /etc/kubernetes/pki/sa.key).
func preflightInput(o preflightOpts, signingKey string, warn func(error)) preflight.Input {
	key := signingKey
	if key == "" {
		key = defaultSigningKey
	}
	return preflight.Input{Files: o.preflightFiles, FlagsFiles: o.preflightFlagsFiles, Now: time.Now(), SigningKey: key, Warn: warn}
}
