package signer

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// ValidHost checks this host's name (--host, or hostname -f) before it
// names KEYS-PREFIX/HOST and TRUST-PREFIX/HOST: one level under each
// prefix, as kube-apiserver-safe-restart refuses a --host with "/". A
// name with "/" or ".." would write the trust record where the barrier
// (which reads one level) never looks; a control character would forge
// log lines.
func ValidHost(host string) error {
	switch {
	case host == "":
		return errors.New("host name: empty")
	case strings.Contains(host, "/"):
		return fmt.Errorf("host name %q: must not contain /", host)
	case host == "." || strings.Contains(host, ".."):
		return fmt.Errorf("host name %q: must not be . or contain ..", host)
	case strings.ContainsFunc(host, unicode.IsControl):
		return fmt.Errorf("host name %q: must not contain control characters", host)
	}
	return nil
}
