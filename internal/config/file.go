package config

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/keysync/confd/internal/suggest"
)

// File is a configuration file, read and checked.
type File struct {
	Path   string
	Values map[string]Value
}

// Value is one key's setting in a file.
type Value struct {
	Line int // 0 when the line could not be found
	// Items are the value as flag arguments: one for a scalar, one per
	// element for a list.
	Items []string
}

// where is "PATH:LINE" (or PATH when the line is unknown).
func (v Value) where(path string) string {
	if v.Line > 0 {
		return fmt.Sprintf("%s:%d", path, v.Line)
	}
	return path
}

// Where names the place a key was set, for messages and `config`; "" when
// the file does not set it.
func (f *File) Where(name string) string {
	if f == nil {
		return ""
	}
	if v, ok := f.Values[name]; ok {
		return v.where(f.Path)
	}
	return ""
}

// Load reads path. Every problem is reported, each naming the file and
// line: an unknown key (with what was probably meant), a table, a value of
// the wrong type, a duration that does not parse.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("configuration file: %w", err)
	}
	return Parse(path, data)
}

// Parse is Load for data already read; path names the file in errors.
func Parse(path string, data []byte) (*File, error) {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s:%d: %s", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f := &File{Path: path, Values: map[string]Value{}}
	lines := KeyLines(data)
	// Report in file order, as a person reads the file.
	names := slices.SortedFunc(maps.Keys(raw), func(a, b string) int {
		return cmp.Or(cmp.Compare(lines[a], lines[b]), cmp.Compare(a, b))
	})
	var errs []error
	for _, n := range names {
		where := Value{Line: lines[n]}.where(path)
		k, ok := Lookup(n)
		if !ok {
			hint := ""
			if slices.Contains(CommandLineOnly, n) {
				hint = " (a command-line choice for one run, not a setting)"
			} else if _, table := raw[n].(map[string]any); table {
				hint = " (the file is flat: keys are flag names, no [tables])"
			} else if m := suggest.Closest(n, Names()); m != "" {
				hint = fmt.Sprintf("; did you mean %q?", m)
			}
			errs = append(errs, fmt.Errorf("%s: unknown key %q%s", where, n, hint))
			continue
		}
		items, err := convert(k, raw[n])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", where, n, err))
			continue
		}
		f.Values[n] = Value{Line: lines[n], Items: items}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

// convert checks v against k's kind and turns it into flag arguments.
func convert(k Key, v any) ([]string, error) {
	switch k.Kind {
	case String:
		if s, ok := v.(string); ok {
			return []string{s}, nil
		}
	case Duration:
		if s, ok := v.(string); ok {
			if _, err := time.ParseDuration(s); err != nil {
				return nil, fmt.Errorf("%q is not a duration (e.g. \"90s\", \"10m\")", s)
			}
			return []string{s}, nil
		}
	case Int:
		if n, ok := v.(int64); ok {
			return []string{strconv.FormatInt(n, 10)}, nil
		}
	case Bool:
		if b, ok := v.(bool); ok {
			return []string{strconv.FormatBool(b)}, nil
		}
	case List:
		switch x := v.(type) {
		case string:
			return []string{x}, nil
		case []any:
			out := make([]string, 0, len(x))
			for i, item := range x {
				s, ok := item.(string)
				if !ok {
					return nil, fmt.Errorf("element %d: want a string, got a TOML %s", i+1, tomlType(item))
				}
				out = append(out, s)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("want %s, got a TOML %s", k.Kind, tomlType(v))
}

func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "table"
	case time.Time:
		return "datetime"
	}
	return fmt.Sprintf("%T", v)
}

// keyAt matches the start of a key assignment: name, "name" or
// 'name', then =.
var keyAt = regexp.MustCompile(`^\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_-]+))\s*=`)

// tableAt matches a table header, [name] or [[name]].
var tableAt = regexp.MustCompile(`^\s*\[+\s*"?([^\]"]+)"?\s*\]`)

// KeyLines maps each key to the line that defines it, by its dotted path
// ("name" at the top level, "table.name" inside [table]), and each table
// header to its line, by the table's name. BurntSushi/toml keeps key
// positions to itself, so the lines are found by reading the file: a line
// inside a multi-line string or array is skipped by tracking brackets and
// triple quotes; dotted and inline keys are not found. It serves this
// package's flat file, confd.toml and confd's resources alike, and only
// locates a key for a message: the loaders remain the parsers.
func KeyLines(data []byte) map[string]int {
	out := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	depth, inTriple, table := 0, "", ""
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if inTriple != "" {
			if bytes.Count([]byte(line), []byte(inTriple))%2 == 1 {
				inTriple = ""
			}
			continue
		}
		if depth == 0 {
			name := ""
			if m := keyAt.FindStringSubmatch(line); m != nil {
				name = m[1] + m[2] + m[3]
				if table != "" {
					name = table + "." + name
				}
			} else if t := tableAt.FindStringSubmatch(line); t != nil {
				table = strings.TrimSpace(t[1])
				name = table
			}
			if _, seen := out[name]; name != "" && !seen {
				out[name] = n
			}
		}
		depth += bracketDepth(line)
		for _, q := range []string{`"""`, `'''`} {
			if bytes.Count([]byte(line), []byte(q))%2 == 1 {
				inTriple = q
			}
		}
	}
	return out
}

// bracketDepth is the change in array nesting on one line, outside quoted
// strings and comments.
func bracketDepth(line string) int {
	d := 0
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#':
			return d
		case c == '[':
			d++
		case c == ']':
			d--
		}
	}
	return d
}
