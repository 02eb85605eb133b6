// Package template renders confd templates: Go text/template over a
// memkv-compatible store with confd 0.16's function set. It does no I/O beyond reading the
// template file, so callers decide where (and whether) the bytes land.
package template

import (
	"fmt"

	kvstore "github.com/keysync/confd/store"
)

// RenderIndex parses the template file at srcPath and executes it over
// store, whose keys are absolute paths ("/app/db/user") already stripped
// of the resource prefix, keeping the parse for the next render (a nil
// *Renderer keeps none).
//
// The template is named filepath.Base(srcPath), as confd names it, so
// text/template's own messages ("template: NAME:LINE:COL: ...") read the
// same as confd's; the returned error adds the full path in front.
func (c *Renderer) RenderIndex(srcPath string, store *kvstore.Index, o Options) (Text, error) {
	p, err := c.get(srcPath)
	if err != nil {
		return Text{}, err
	}
	// The crypt functions decrypt with this render's keyring and remember
	// what they decrypted.
	var decrypted []string
	*p.b = binding{store: store, keyring: o.Keyring, seen: func(v string) { decrypted = append(decrypted, v) }, warn: o.Warn, readOnlyGets: p.readOnlyGets}

	// Memory, never the destination: a failed execution must not leave a
	// half-written file behind. confd passes no data (dot is nil).
	var out textWriter
	err = p.tmpl.Execute(&out, nil)
	// The kept parse must not keep this render's keys alive.
	*p.b = binding{}
	c.put(p)
	text, terr := out.text()
	if err != nil {
		text.Release()
		return Text{}, fmt.Errorf("execute template %s: %w", srcPath, withoutValues(err, store, decrypted))
	}
	if terr != nil {
		return Text{}, fmt.Errorf("template %s: %w", srcPath, terr)
	}
	return text, nil
}

// CheckFile parses the template at srcPath without executing it, so that
// syntax errors and unknown function names show before any key is read.
func CheckFile(srcPath string) error {
	_, err := (*Renderer)(nil).get(srcPath)
	return err
}
