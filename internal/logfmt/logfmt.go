// Package logfmt sets up logrus the way confd 0.16 printed its logs, so that
// log scrapers written for confd keep working, with JSON as an option.
package logfmt

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/redact"
)

// ConfdFormatter prints "TIME HOST TAG[PID]: LEVEL message", as confd did;
// structured fields follow the message as key=value.
type ConfdFormatter struct {
	Tag      string
	Hostname string
	PID      int
}

// Format implements logrus.Formatter.
func (f *ConfdFormatter) Format(e *logrus.Entry) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s[%d]: %s %s", e.Time.Format(time.RFC3339), f.Hostname, f.Tag, f.PID, strings.ToUpper(e.Level.String()), e.Message)
	keys := make([]string, 0, len(e.Data))
	for k := range e.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, e.Data[k])
	}
	b.WriteByte('\n')
	return []byte(b.String()), nil
}

// New returns a logger writing to w at level ("" means info) in format
// "text" (confd's) or "json".
func New(w io.Writer, level, format string) (*logrus.Logger, error) {
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
		host, _ := os.Hostname()
		l.SetFormatter(redacting{&ConfdFormatter{Tag: filepath.Base(os.Args[0]), Hostname: host, PID: os.Getpid()}})
	case "json":
		l.SetFormatter(redacting{&logrus.JSONFormatter{}})
	default:
		return nil, fmt.Errorf("-log-format %q: want text or json", format)
	}
	return l, nil
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
