// Package file serves keys from YAML and JSON files, as confd's file
// backend does: nested mappings become paths ("a: {b: 1}" is /a/b = "1"),
// list items are numbered from 0.
package file

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/keysync/confd/backends"
)

// Client reads its files on every GetValues, so that interval polling sees
// edits without a restart.
type Client struct {
	paths  []string
	filter string
}

// New returns a client for paths, each a file or a directory searched
// recursively for files whose base name matches the glob filter ("" means
// "*"). Files named directly are read whatever their name.
func New(paths []string, filter string) (*Client, error) {
	if len(paths) == 0 {
		return nil, errors.New("file backend: no file or directory given (-file)")
	}
	filter = cmp.Or(filter, "*")
	if _, err := filepath.Match(filter, ""); err != nil {
		return nil, fmt.Errorf("file backend: filter %q: %w", filter, err)
	}
	return &Client{paths: slices.Clone(paths), filter: filter}, nil
}

// GetValues reads every file, later files overriding earlier ones on the
// same key, and keeps the keys that are one of keys or lie below one of them
// as a path. The revision is always 0.
func (c *Client) GetValues(ctx context.Context, keys []string) (map[string]string, int64, error) {
	files, err := c.files()
	if err != nil {
		return nil, 0, err
	}
	vars := make(map[string]string)
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		if err := readFile(f, vars); err != nil {
			return nil, 0, err
		}
	}
	maps.DeleteFunc(vars, func(k, _ string) bool { return !backends.KeyUnderAny(k, keys) })
	return vars, 0, nil
}

// Close has nothing to release.
func (c *Client) Close() error { return nil }

// files lists the files to read, in the order given and, within a
// directory, in lexical order, so that overrides are reproducible.
func (c *Client) files() ([]string, error) {
	var out []string
	for _, p := range c.paths {
		// Resolve first so that a symlink to a directory (a Kubernetes
		// ConfigMap mount is one) is searched like the directory itself.
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("file backend: %w", err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("file backend: %w", err)
		}
		if !fi.IsDir() {
			out = append(out, p)
			continue
		}
		err = filepath.WalkDir(real, func(name string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if ok, _ := filepath.Match(c.filter, d.Name()); d.IsDir() || !ok {
				return nil
			}
			// A symlink inside the directory counts when it leads to a file.
			if st, err := os.Stat(name); err != nil || st.IsDir() {
				return nil
			}
			// Name the file under the path as given, for error messages.
			if rel, err := filepath.Rel(real, name); err == nil {
				name = filepath.Join(p, rel)
			}
			out = append(out, name)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("file backend: searching %s: %w", p, err)
		}
	}
	return out, nil
}

func readFile(name string, vars map[string]string) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("file backend: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	// confd read only the first document of a file; later documents are
	// read too, so that a "---"-separated file does not lose data silently.
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// yaml's messages carry the line ("yaml: line 3: ...").
			return fmt.Errorf("file backend: %s: %w", name, err)
		}
		root, err := (&walker{file: name, visiting: map[*yaml.Node]bool{}}).value(&doc)
		if err != nil {
			return err
		}
		switch root.(type) {
		case nil, *mapping:
		default:
			line := doc.Line
			if len(doc.Content) > 0 {
				line = doc.Content[0].Line
			}
			return fmt.Errorf("file backend: %s:%d: top level must be a mapping of keys", name, line)
		}
		flatten(root, "/", vars)
	}
}

// mapping is a YAML mapping with its keys in first-seen order, so that
// flattening is deterministic when two paths collide ("a/b: 1" and
// "a: {b: 2}").
type mapping struct {
	keys []string
	vals map[string]any
}

func (m *mapping) set(k string, v any) {
	if _, ok := m.vals[k]; !ok {
		m.keys = append(m.keys, k)
	}
	m.vals[k] = v
}

// maxValues bounds alias expansion ("billion laughs"): a config file has
// nowhere near this many values.
const maxValues = 1 << 20

// walker turns a YAML node tree into mappings, lists and strings with the
// meaning confd gave them. confd decoded with gopkg.in/yaml.v2 (YAML 1.1),
// and the strings a template sees depend on that decoder's typing: "yes"
// is the bool true and so renders "true", "2018-01-02" stays as written,
// "0x1F" renders "31", "1.50" renders "1.5". Walking nodes ourselves
// reproduces that with yaml.v3, whose typing of plain scalars is YAML 1.2.
type walker struct {
	file     string
	values   int
	visiting map[*yaml.Node]bool // aliases being expanded, to refuse cycles
}

// value returns *mapping, []any, string, or nil for a null (which confd
// dropped: a null value produces no key).
func (w *walker) value(n *yaml.Node) (any, error) {
	w.values++
	if w.values > maxValues {
		return nil, w.errorf(n, "more than %d values (recursive aliases?)", maxValues)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return w.value(n.Content[0])
	case yaml.AliasNode:
		if w.visiting[n.Alias] {
			return nil, w.errorf(n, "alias *%s refers to itself", n.Value)
		}
		w.visiting[n.Alias] = true
		defer delete(w.visiting, n.Alias)
		return w.value(n.Alias)
	case yaml.SequenceNode:
		list := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			v, err := w.value(item)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		return list, nil
	case yaml.MappingNode:
		m := &mapping{vals: make(map[string]any)}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
				if err := w.merge(m, v); err != nil {
					return nil, err
				}
				continue
			}
			key, err := w.key(k)
			if err != nil {
				return nil, err
			}
			val, err := w.value(v)
			if err != nil {
				return nil, err
			}
			// A repeated key replaces the earlier value, as yaml.v2 did.
			m.set(key, val)
		}
		return m, nil
	case yaml.ScalarNode:
		return w.scalar(n)
	}
	return nil, w.errorf(n, "unexpected YAML node")
}

// merge applies a "<<" key the way yaml.v2 did: entries are set in place,
// replacing what came before and replaced by what comes after; of a list of
// maps, the first wins.
func (w *walker) merge(m *mapping, n *yaml.Node) error {
	target := n
	if target.Kind == yaml.AliasNode {
		target = target.Alias
	}
	var sources []*yaml.Node
	switch target.Kind {
	case yaml.MappingNode:
		sources = []*yaml.Node{n}
	case yaml.SequenceNode:
		for i := len(target.Content) - 1; i >= 0; i-- {
			sources = append(sources, target.Content[i])
		}
	default:
		return w.errorf(n, "value of merge key << must be a mapping or a list of mappings")
	}
	for _, s := range sources {
		v, err := w.value(s)
		if err != nil {
			return err
		}
		src, ok := v.(*mapping)
		if !ok {
			return w.errorf(s, "value of merge key << must be a mapping or a list of mappings")
		}
		for _, k := range src.keys {
			m.set(k, src.vals[k])
		}
	}
	return nil
}

// key returns a mapping key as written. confd panicked on keys that
// yaml.v2 typed as anything but a string (80:, true:); their text is the
// only sensible path segment.
func (w *walker) key(n *yaml.Node) (string, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode {
		return "", w.errorf(n, "mapping key must be a scalar")
	}
	return n.Value, nil
}

// yaml11Bools are the booleans of YAML 1.1 (yaml.v2) that YAML 1.2
// (yaml.v3) reads as strings.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

func (w *walker) scalar(n *yaml.Node) (any, error) {
	const quoted = yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle | yaml.LiteralStyle | yaml.FoldedStyle
	if n.Style&quoted != 0 && n.Style&yaml.TaggedStyle == 0 {
		return n.Value, nil
	}
	if n.Style&yaml.TaggedStyle == 0 {
		if b, ok := yaml11Bools[n.Value]; ok {
			return strconv.FormatBool(b), nil
		}
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, w.errorf(n, "%v", err)
	}
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return v, nil
	case bool, int, int64, uint64:
		return fmt.Sprint(v), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	default:
		// time.Time among others: yaml.v2 left timestamps untyped, so confd
		// rendered them as written.
		return n.Value, nil
	}
}

func (w *walker) errorf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("file backend: %s:%d: %s", w.file, n.Line, fmt.Sprintf(format, args...))
}

// flatten writes the leaves of v under key into vars: mapping keys and list
// indexes joined with path.Join, as confd did.
func flatten(v any, key string, vars map[string]string) {
	switch v := v.(type) {
	case *mapping:
		for _, k := range v.keys {
			flatten(v.vals[k], path.Join(key, k), vars)
		}
	case []any:
		for i, item := range v {
			flatten(item, path.Join(key, strconv.Itoa(i)), vars)
		}
	case string:
		vars[key] = v
	}
}
