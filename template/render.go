// Package template renders confd templates: Go text/template over a
// memkv-compatible store with confd 0.16's function set. It does no I/O beyond reading the
// template file, so callers decide where (and whether) the bytes land.
package template

import (
	"fmt"
	"os"
	"path/filepath"
	texttemplate "text/template"

	kvstore "github.com/keysync/confd/store"
)

// Render parses the template file at srcPath and executes it over kvs,
// whose keys are absolute paths ("/app/db/user") already stripped of the
// resource prefix.
//
// The template is named filepath.Base(srcPath), as confd names it, so
// text/template's own messages ("template: NAME:LINE:COL: ...") read the
// same as confd's; the returned error adds the full path in front.
func Render(srcPath string, kvs map[string]string, opts ...Option) ([]byte, error) {
	// A fresh store per render: keys deleted upstream must not linger, and
	// concurrent renders must not see each other's keys.
	return RenderIndex(srcPath, kvstore.New(kvs), opts...)
}

// RenderIndex is Render over an index the caller built (kvstore.FromPairs),
// so that a large snapshot need not pass through a map on its way.
func RenderIndex(srcPath string, store *kvstore.Index, opts ...Option) ([]byte, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	tmpl, err := parseFile(srcPath, store)
	if err != nil {
		return nil, err
	}
	// The crypt functions FuncMap defined are swapped for ones that decrypt
	// with this render's keyring and remember what they decrypted.
	var decrypted []string
	tmpl.Funcs(cryptFuncs(FuncMap(store), o.keyring, func(v string) { decrypted = append(decrypted, v) }))

	// A buffer, never the destination: a failed execution must not leave a
	// half-written file behind. confd passes no data (dot is nil).
	var out chunks
	if err := tmpl.Execute(&out, nil); err != nil {
		return nil, fmt.Errorf("execute template %s: %w", srcPath, withoutValues(err, store, decrypted))
	}
	return out.bytes(), nil
}

// CheckFile parses the template at srcPath without executing it, so that
// syntax errors and unknown function names show before any key is read.
func CheckFile(srcPath string) error {
	_, err := parseFile(srcPath, kvstore.New(nil))
	return err
}

func parseFile(srcPath string, store *kvstore.Index) (*texttemplate.Template, error) {
	// Reading the file ourselves (rather than ParseFiles) keeps "cannot read"
	// apart from "does not parse"; ParseFiles would do exactly this Parse on
	// a template of the same name, so the result is the same.
	src, err := os.ReadFile(srcPath)
	if err != nil {
		return nil, fmt.Errorf("read template %s: %w", srcPath, err)
	}
	tmpl, err := texttemplate.New(filepath.Base(srcPath)).Funcs(FuncMap(store)).Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parse template %s: %w", srcPath, err)
	}
	return tmpl, nil
}

// maxChunk is the largest piece the render output grows by.
const maxChunk = 64 << 10

// chunks collects the render output in fixed-size pieces and joins them
// once, at their exact total size. A doubling buffer would allocate about
// twice the output in ever larger blocks, each of which needs fresh
// contiguous memory: for an 8 MB file, 15 MB more peak RSS.
type chunks struct {
	full [][]byte
	cur  []byte
	n    int
}

func (c *chunks) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(c.cur) == cap(c.cur) {
			if c.cur != nil {
				c.full = append(c.full, c.cur)
			}
			c.cur = make([]byte, 0, min(max(2*cap(c.cur), 512), maxChunk))
		}
		k := copy(c.cur[len(c.cur):cap(c.cur)], p)
		c.cur = c.cur[:len(c.cur)+k]
		p = p[k:]
	}
	c.n += n
	return n, nil
}

func (c *chunks) bytes() []byte {
	if len(c.full) == 0 {
		return c.cur
	}
	out := make([]byte, 0, c.n)
	for _, b := range c.full {
		out = append(out, b...)
	}
	return append(out, c.cur...)
}
