package template

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	texttemplate "text/template"
)

// Renderer renders templates and keeps the parses of recent renders. A
// render still reads its template file every time, so an edit takes effect
// on the next pass as in confd 0.16, but parses it again only when its
// bytes changed: giving a new template confd's 60-odd functions costs more
// than rendering a small file from a few keys (BenchmarkRenderSmall), and in
// watch mode that cost sits between a put and the file. The parses belong
// to the Renderer, not the package, so that whoever renders decides how
// long they live. The zero value is ready for use; a nil *Renderer keeps no
// parse.
type Renderer struct {
	mu   sync.Mutex
	idle map[string]*parsed // by template path; not in use by any render
}

// maxKeptParses bounds the memory kept: a parse with its function tables
// is about 7 kB, and a daemon may have thousands of resources. The ones
// that change often are the ones a bound keeps.
const maxKeptParses = 64

// parsed is a template parsed from src, its functions reading b.
type parsed struct {
	path, src    string
	tmpl         *texttemplate.Template
	b            *binding
	readOnlyGets bool // sharesGets(tmpl)
}

// get returns the template at srcPath parsed from the bytes it holds now,
// for the caller's use alone until it puts it back: its binding is the
// caller's render's. Two renders of one path at once each get their own.
func (c *Renderer) get(srcPath string) (*parsed, error) {
	// Reading the file ourselves (rather than ParseFiles) keeps "cannot
	// read" apart from "does not parse"; ParseFiles would do exactly the
	// Parse below on a template of the same name, so the result is the same.
	b, err := os.ReadFile(srcPath)
	if err != nil {
		return nil, fmt.Errorf("read template %s: %w", srcPath, err)
	}
	src := string(b)
	var p *parsed
	if c != nil {
		c.mu.Lock()
		p = c.idle[srcPath]
		delete(c.idle, srcPath)
		c.mu.Unlock()
	}
	if p != nil && p.src == src {
		return p, nil
	}
	bind := &binding{}
	tmpl, err := texttemplate.New(filepath.Base(srcPath)).Funcs(funcMap(bind)).Parse(src)
	if err != nil {
		return nil, fmt.Errorf("parse template %s: %w", srcPath, err)
	}
	return &parsed{path: srcPath, src: src, tmpl: tmpl, b: bind, readOnlyGets: sharesGets(tmpl)}, nil
}

// put keeps p for the next render of its path. Past the bound, another
// path's parse goes: any one (map order is random), which keeps a template
// that renders often likely to stay.
func (c *Renderer) put(p *parsed) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle == nil {
		c.idle = map[string]*parsed{}
	}
	if _, ok := c.idle[p.path]; !ok && len(c.idle) >= maxKeptParses {
		for path := range c.idle {
			delete(c.idle, path)
			break
		}
	}
	c.idle[p.path] = p
}
