package rehearsal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Unit is what the rehearsal needs from a systemd service unit: how to run
// it, as systemd would.
type Unit struct {
	Name             string
	Environment      []string // KEY=VALUE, from Environment= lines in order
	EnvironmentFiles []string // EnvironmentFile= paths; a leading "-" means optional
	ExecStartPre     []string // raw command lines
	ExecStart        []string
	ExecReload       []string
	// Settings holds the other [Service] keys (Type=, Restart=,
	// RestartSec=, RuntimeDirectory=, ...): the last assignment wins.
	Settings map[string]string
}

// ParseUnit reads the [Service] section of a unit file: continuation
// lines, comments, Environment=, EnvironmentFile=, ExecStartPre=,
// ExecStart= and ExecReload=; other keys go to Settings. Errors name the
// unit and line.
func ParseUnit(name, text string) (*Unit, error) {
	u := &Unit{Name: name}
	if err := u.parse(name, text); err != nil {
		return nil, err
	}
	if len(u.ExecStart) == 0 {
		return nil, fmt.Errorf("%s: no ExecStart=", name)
	}
	return u, nil
}

// LoadUnit reads dir/name and then its drop-ins, dir/name.d/*.conf in
// file-name order, as systemd applies them: each list setting appends, and
// an empty assignment (ExecStartPre=) clears what came before.
func LoadUnit(dir, name string) (*Unit, error) {
	main := filepath.Join(dir, name)
	text, err := os.ReadFile(main)
	if err != nil {
		return nil, err
	}
	u := &Unit{Name: name}
	if err := u.parse(main, string(text)); err != nil {
		return nil, err
	}
	dropIns, err := filepath.Glob(filepath.Join(dir, name+".d", "*.conf"))
	if err != nil {
		return nil, err
	}
	sort.Strings(dropIns)
	for _, d := range dropIns {
		text, err := os.ReadFile(d)
		if err != nil {
			return nil, err
		}
		if err := u.parse(d, string(text)); err != nil {
			return nil, err
		}
	}
	if len(u.ExecStart) == 0 {
		return nil, fmt.Errorf("%s: no ExecStart=", main)
	}
	return u, nil
}

// parse applies one unit file or drop-in (name is for errors) to u.
func (u *Unit) parse(name, text string) error {
	section := ""
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		lineNo := i + 1
		line := strings.TrimSpace(lines[i])
		// A trailing backslash continues the line; systemd joins with a space.
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section = strings.Trim(line, "[]")
			continue
		}
		if section != "Service" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("%s:%d: not KEY=VALUE: %q", name, lineNo, line)
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		var list *[]string
		switch key {
		case "Environment":
			list = &u.Environment
		case "EnvironmentFile":
			list = &u.EnvironmentFiles
		case "ExecStartPre":
			list = &u.ExecStartPre
		case "ExecStart":
			list = &u.ExecStart
		case "ExecReload":
			list = &u.ExecReload
		default:
			if u.Settings == nil {
				u.Settings = map[string]string{}
			}
			u.Settings[key] = value
			continue
		}
		switch {
		case value == "":
			*list = nil
		case key == "Environment":
			words, err := splitWords(value, nil)
			if err != nil {
				return fmt.Errorf("%s:%d: Environment: %w", name, lineNo, err)
			}
			*list = append(*list, words...)
		default:
			*list = append(*list, value)
		}
	}
	return nil
}

// Env is the unit's environment on top of base (KEY=VALUE entries): its
// Environment= lines, then its EnvironmentFile= files in order.
func (u *Unit) Env(base []string) ([]string, error) {
	env := append([]string(nil), base...)
	env = append(env, u.Environment...)
	for _, f := range u.EnvironmentFiles {
		path, optional := strings.CutPrefix(f, "-")
		data, err := os.ReadFile(path)
		if err != nil {
			if optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("%s: EnvironmentFile: %w", u.Name, err)
		}
		vars, err := ParseEnvFile(path, string(data))
		if err != nil {
			return nil, err
		}
		env = append(env, vars...)
	}
	return env, nil
}

// ParseEnvFile reads a systemd EnvironmentFile: KEY=VALUE lines, comments,
// values optionally in double or single quotes.
func ParseEnvFile(name, text string) ([]string, error) {
	var out []string
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: not KEY=VALUE", name, i+1)
		}
		words, err := splitWords(strings.TrimSpace(value), nil)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %w", name, i+1, key, err)
		}
		out = append(out, strings.TrimSpace(key)+"="+strings.Join(words, " "))
	}
	return out, nil
}

// Command expands one Exec line as systemd does: words split on blanks,
// quotes and backslashes honoured, "$VAR" as a whole word split into words,
// "${VAR}" replaced as one word. A leading "-" (failure ignored) is
// returned as ignoreFailure.
func Command(line string, env []string) (argv []string, ignoreFailure bool, err error) {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "-") {
		ignoreFailure, line = true, line[1:]
	}
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	argv, err = splitWords(line, vars)
	if err == nil && len(argv) == 0 {
		err = errors.New("empty command")
	}
	return argv, ignoreFailure, err
}

// splitWords splits s into words with systemd's quoting rules. With vars,
// variables are expanded as in Exec lines; without, "$" is literal.
func splitWords(s string, vars map[string]string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote byte
	flush := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != '\'' && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case quote == 0 && (c == '"' || c == '\''):
			quote, inWord = c, true
		case quote == 0 && (c == ' ' || c == '\t'):
			flush()
		case vars != nil && quote != '\'' && c == '$' && i+1 < len(s) && s[i+1] == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf("unterminated ${ in %q", s)
			}
			cur.WriteString(vars[s[i+2:i+end]])
			inWord = true
			i += end
		case vars != nil && quote == 0 && !inWord && c == '$':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			if j < len(s) && s[j] != ' ' && s[j] != '\t' {
				return nil, fmt.Errorf("$VAR must be a whole word in %q", s)
			}
			words = append(words, strings.Fields(vars[s[i+1:j]])...)
			i = j - 1
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	flush()
	return words, nil
}
