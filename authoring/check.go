// Package authoring serves template authors: Check vets a confdir
// (confd.toml, resources, templates) without contacting a store, and
// Validate renders resources from mock data, writing and running nothing.
package authoring

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/redact"
	"github.com/keysync/confd/resource"
	"github.com/keysync/confd/template"
)

// ConfigFile describes confd.toml for Check.
type ConfigFile struct {
	Path     string
	Required bool // named on the command line: a missing file is a problem
	// Set reports what confd would make of one top-level key: nil when it
	// is read and its value is valid, else an error that names the key.
	Set func(key string, value any) error
}

// CheckOptions are Check's inputs.
type CheckOptions struct {
	Config    ConfigFile
	Settings  apply.Settings // as the run would use them; Log is replaced
	Resources []string       // -resource names; none means every resource
	// Validate checks the combined configuration (flags, environment and
	// file) as a run would before starting; nil skips it.
	Validate func() error
	Out      io.Writer // the report
}

// Problem is one finding, located as precisely as its source allows.
type Problem struct {
	File string // empty for the combined configuration
	Line int    // 0 when unknown
	Msg  string
}

func (p Problem) String() string {
	switch {
	case p.File == "":
		return "configuration: " + p.Msg
	case p.Line > 0:
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg)
	}
	return p.File + ": " + p.Msg
}

// Check reports every problem it finds to opts.Out, one per line, and
// returns the exit code: 0 when there is none, 1 otherwise. A warning a run
// would log (an unknown key, a mode without its leading zero) counts as a
// problem: the author asked to be told.
func Check(ctx context.Context, opts CheckOptions) int {
	ps := checkConfigFile(opts.Config)
	if opts.Validate != nil {
		if err := opts.Validate(); err != nil {
			ps = append(ps, Problem{Msg: err.Error()})
		}
	}
	rs, rps := loadResources(opts.Settings, opts.Resources)
	ps = append(ps, rps...)
	templates := map[string]bool{}
	for _, r := range rs {
		if ctx.Err() != nil {
			break
		}
		if templates[r.Src] {
			continue
		}
		templates[r.Src] = true
		if err := template.CheckFile(r.Src); err != nil {
			ps = append(ps, templateProblem(r.Src, err))
		}
	}
	for _, p := range ps {
		fmt.Fprintln(opts.Out, p)
	}
	if len(ps) > 0 {
		fmt.Fprintf(opts.Out, "%d problem(s) found\n", len(ps))
		return 1
	}
	fmt.Fprintf(opts.Out, "OK: %d resource(s), %d template(s)\n", len(rs), len(templates))
	return 0
}

func checkConfigFile(c ConfigFile) []Problem {
	if c.Path == "" {
		return nil
	}
	data, err := os.ReadFile(c.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !c.Required {
			return nil
		}
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = fmt.Errorf("%s: %w", pe.Op, pe.Err)
		}
		return []Problem{{File: c.Path, Msg: err.Error()}}
	}
	raw := map[string]any{}
	if _, err := toml.Decode(string(data), &raw); err != nil {
		if perr, ok := errors.AsType[toml.ParseError](err); ok {
			return []Problem{{File: c.Path, Line: perr.Position.Line, Msg: redact.ParseMessage(data, perr.Position.Line, perr.Message)}}
		}
		return []Problem{{File: c.Path, Msg: err.Error()}}
	}
	var ps []Problem
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		if c.Set == nil {
			break
		}
		if err := c.Set(k, raw[k]); err != nil {
			line := config.KeyLines(data)[k]
			switch raw[k].(type) {
			case map[string]any, []map[string]any:
				line = 0 // a [table] is reported without its header's line, as it always was
			}
			ps = append(ps, Problem{File: c.Path, Line: line, Msg: err.Error()})
		}
	}
	sortProblems(ps)
	return ps
}

// loadResources loads through the resource package, as a run does, and
// turns its errors and the warnings it logs into problems.
func loadResources(s apply.Settings, names []string) ([]*resource.Resource, []Problem) {
	rec := &recorder{}
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.SetLevel(logrus.WarnLevel)
	log.AddHook(rec)
	s.Log = log
	s.Noop = true // nothing here may act, whatever the caller set
	rs, errs := resource.LoadNamed(&s.Settings, names)
	var ps []Problem
	for _, msg := range rec.msgs {
		ps = append(ps, locate(msg))
	}
	for _, err := range errs {
		ps = append(ps, locate(err.Error()))
	}
	sortProblems(ps)
	return rs, ps
}

func sortProblems(ps []Problem) {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
}

// recorder keeps the warnings the loader logs.
type recorder struct{ msgs []string }

func (r *recorder) Levels() []logrus.Level { return logrus.AllLevels[:logrus.WarnLevel+1] }

func (r *recorder) Fire(e *logrus.Entry) error {
	r.msgs = append(r.msgs, e.Message)
	return nil
}

var (
	fileLinePrefix = regexp.MustCompile(`^(\S+?\.toml):(\d+): (.*)$`)
	filePrefix     = regexp.MustCompile(`^(\S+?\.toml): (.*)$`)
	// The resource loader names keys as "template.KEY" (possibly quoted).
	templateKey = regexp.MustCompile(`template\.([A-Za-z0-9_-]+)`)
)

// locate turns a loader message ("FILE: ...", "FILE:LINE: ...") into a
// Problem, finding the line of the template.KEY it names when it has none.
func locate(msg string) Problem {
	if m := fileLinePrefix.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[2])
		return Problem{File: m[1], Line: line, Msg: m[3]}
	}
	m := filePrefix.FindStringSubmatch(msg)
	if m == nil {
		return Problem{Msg: msg}
	}
	p := Problem{File: m[1], Msg: m[2]}
	if k := templateKey.FindStringSubmatch(p.Msg); k != nil {
		if data, err := os.ReadFile(p.File); err == nil {
			p.Line = config.KeyLines(data)["template."+k[1]]
		}
	}
	return p
}

// text/template's messages read "template: NAME:LINE: msg" or
// "template: NAME:LINE:COL: msg".
var templateLine = regexp.MustCompile(`template: [^:]+:(\d+):(?:\d+:)? (.*)$`)

func templateProblem(src string, err error) Problem {
	msg := err.Error()
	if m := templateLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{File: src, Line: line, Msg: m[2]}
	}
	return Problem{File: src, Msg: strings.TrimPrefix(msg, "read template "+src+": ")}
}

// relTo shortens path for display when it lies under dir.
func relTo(dir, path string) string {
	if rel, err := filepath.Rel(dir, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}
