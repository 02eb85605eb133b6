package etcdkey

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// ValidHost checks a host's name (--host, or hostname -f) before it names
// PREFIX/HOST: exactly one level under each prefix. A name with "/" or
// ".." would write a record where the readers (one level deep) never look;
// a control character would forge log lines.
func ValidHost(host string) error {
	switch {
	case host == "":
		return errors.New("host name: empty")
	case strings.Contains(host, "/"):
		return fmt.Errorf("host name %q: must not contain /", host)
	case host == "." || strings.Contains(host, ".."):
		return fmt.Errorf("host name %q: must not be \".\" or contain \"..\"", host)
	case strings.ContainsFunc(host, unicode.IsControl):
		return fmt.Errorf("host name %q: must not contain control characters", host)
	}
	return nil
}
