// Package logfmt sets up logrus the way confd 0.16 printed its logs, so that
// log scrapers written for confd keep working, with JSON as an option.
package logfmt

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/redact"
)

// ConfdFormatter prints "TIME HOST TAG[PID]: LEVEL message", as confd did;
// structured fields follow the message as key=value.
type ConfdFormatter struct {
	Tag      string
	Hostname string
	PID      int
	// Child drops TIME and HOST: for a program whose output confd logs,
	// under its own prefix that already has both.
	Child bool
}

// Format implements logrus.Formatter.
func (f *ConfdFormatter) Format(e *logrus.Entry) ([]byte, error) {
	var b strings.Builder
	if !f.Child {
		fmt.Fprintf(&b, "%s %s ", e.Time.Format(time.RFC3339), f.Hostname)
	}
	fmt.Fprintf(&b, "%s[%d]: %s %s", f.Tag, f.PID, strings.ToUpper(e.Level.String()), e.Message)
	for _, k := range slices.Sorted(maps.Keys(e.Data)) {
		fmt.Fprintf(&b, " %s=%v", k, e.Data[k])
	}
	b.WriteByte('\n')
	return []byte(b.String()), nil
}

// New returns a logger writing to w at level ("" means info) in format
// "text" (confd's) or "json". A child is a program whose output confd logs
// line by line (it finds ResourceEnv set): its text is "TAG[PID]: LEVEL
// message key=value" (confd's format without the time and host that
// confd's own prefix adds), its JSON has no time field.
func New(w io.Writer, level, format string, child bool) (*logrus.Logger, error) {
	l := logrus.New()
	l.SetOutput(w)
	if level != "" {
		lv, err := logrus.ParseLevel(level)
		if err != nil {
			return nil, fmt.Errorf("-log-level %q: %w", level, err)
		}
		l.SetLevel(lv)
	}
	switch format {
	case "", "text":
		f := &ConfdFormatter{Tag: filepath.Base(os.Args[0]), PID: os.Getpid(), Child: child}
		if !child {
			f.Hostname, _ = os.Hostname()
		}
		l.SetFormatter(redacting{f})
	case "json":
		l.SetFormatter(redacting{&logrus.JSONFormatter{DisableTimestamp: child}})
	default:
		return nil, fmt.Errorf("-log-format %q: want text or json", format)
	}
	return l, nil
}

// ResourceEnv is the variable confd sets for its check_cmd and reload_cmd:
// the resource file they run for. A program that finds it logs as a child
// (New): one plain line under confd's prefix.
const ResourceEnv = "CONFD_RESOURCE"

// ChildEnv is env (nil: this process's) with ResourceEnv set to resource.
func ChildEnv(env []string, resource string) []string {
	if env == nil {
		env = os.Environ()
	}
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, ResourceEnv+"=") })
	return append(out, ResourceEnv+"="+resource)
}

// Printable is s as a log message shows a command's output line: as it is
// when every character is printable (no control character, no invalid
// UTF-8), else quoted, so that one line stays one record and cannot forge
// another.
func Printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	if s == "" || strings.TrimSpace(s) != s {
		return strconv.Quote(s) // an empty or padded line stays visible
	}
	return s
}

// redacting masks private keys and URL passwords in every formatted record,
// whatever put them into the message or a field: the last guard before the
// log. (In JSON records a key's newlines are escaped; redact handles that.)
type redacting struct{ logrus.Formatter }

func (r redacting) Format(e *logrus.Entry) ([]byte, error) {
	b, err := r.Formatter.Format(e)
	if err != nil {
		return nil, err
	}
	return []byte(redact.String(string(b))), nil
}
