// Package apply is confd's write path: it plans a pass over one template
// resource (render from one snapshot, compare with the live file and the
// owed-reload record) and applies it (stage, check_cmd, atomic replace,
// reload_cmd), recording owed reloads so that none is lost to a crash.
package apply

import (
	"time"

	"github.com/keysync/confd/resource"
	"github.com/keysync/confd/template"
)

// Settings are the process-wide options of the write path, with those
// that shape how resources load.
type Settings struct {
	resource.Settings
	Noop bool // render and diff, write nothing, run nothing
	// NoopShowSecrets lets -noop print the diff of a file that is not
	// world-readable; otherwise only its changed line counts are shown.
	NoopShowSecrets bool
	// Keyring decrypts for the crypt template functions (-secret-keyring); nil without one.
	Keyring *template.Keyring
	// Renderer keeps templates' parses between passes; nil parses each
	// template on every pass.
	Renderer      *template.Renderer
	SyncOnly      bool                                    // write files but run neither check_cmd nor reload_cmd
	KeepStageFile bool                                    // keep the stage file of a failed check for inspection
	DiffOut       interface{ Write([]byte) (int, error) } // where -noop prints diffs
	// CommandGrace is how long a check_cmd or reload_cmd has between
	// SIGTERM (its timeout, or its context ending) and SIGKILL; zero means
	// runner.DefaultGrace.
	CommandGrace time.Duration
	// CommandEnv is the environment of check_cmd and reload_cmd, without
	// confd's own credentials; nil inherits confd's.
	CommandEnv []string
	// Stop, when closed, lets no check_cmd or reload_cmd start (confd is
	// stopping); nil never closes. A reload not started stays owed.
	Stop <-chan struct{}
	// DestLockTimeout is how long a pass waits for another process's pass
	// over the same destination; zero means DefaultDestLockTimeout.
	DestLockTimeout time.Duration
	// LockDir holds the destinations' locks; empty means DefaultLockDir.
	LockDir string
	// Writer and Runner carry out plans; nil means FileWriter and runner.Run.
	Writer Writer
	Runner Runner
}

// File is one resource's destination as the write path keeps it; the
// daemon drives it (daemon.Processor).
type File struct {
	*resource.Resource
	s *Settings
}

// LoadNamed is resource.LoadNamed, each resource with its write path.
func LoadNamed(s *Settings, names []string) ([]*File, []error) {
	rs, errs := resource.LoadNamed(&s.Settings, names)
	fs := make([]*File, len(rs))
	for i, r := range rs {
		fs[i] = &File{Resource: r, s: s}
	}
	return fs, errs
}

func (s *Settings) writer() Writer {
	if s.Writer == nil {
		return FileWriter{Log: s.Logger()}
	}
	return s.Writer
}
