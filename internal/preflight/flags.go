package preflight

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// occurrence is one apiserver flag found in a flags file.
type occurrence struct {
	flag   string // canonical name, without dashes
	value  string
	source string // flags file
	line   int
}

func (o occurrence) String() string {
	return fmt.Sprintf("--%s (%s:%d)", o.flag, o.source, o.line)
}

type token struct {
	text string
	line int
}

// assignmentRE is NAME=value with a shell variable name.
var assignmentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// tokenize turns a flags file into the words a command line built from it
// would hold. It understands, line by line: systemd EnvironmentFile
// assignments (KUBE_API_ARGS="--a=1 --b 2", whose value is split again as
// $KUBE_API_ARGS would be), `export` lines, ExecStart= lines, bare flags one
// or more per line, and static-pod manifest items (`- --flag=value`). Lines
// that are none of these yield words that are not flags, which is harmless.
func tokenize(source string, data []byte) ([]token, []error) {
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	var toks []token
	var errs []error
	for i := 0; i < len(lines); i++ {
		start := i + 1
		text := strings.TrimSpace(lines[i])
		if text == "" || text[0] == '#' || text[0] == ';' {
			continue
		}
		// YAML list item; its quoting is close enough to the shell's.
		if text == "-" || strings.HasPrefix(text, "- ") {
			text = strings.TrimSpace(text[1:])
		}
		// Join continuation lines and quoted values spanning lines.
		words, err := splitWords(text)
		for (err == errUnterminated || endsInBackslash(text)) && i+1 < len(lines) {
			i++
			text += "\n" + lines[i]
			words, err = splitWords(text)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", source, start, err))
			continue
		}
		if len(words) > 0 && words[0] == "export" {
			words = words[1:]
		}
		if len(words) > 0 && assignmentRE.MatchString(words[0]) {
			name, value, _ := strings.Cut(words[0], "=")
			inner, err := splitWords(value)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: value of %s: %w", source, start, name, err))
				continue
			}
			words = append(inner, words[1:]...)
		}
		for _, w := range words {
			toks = append(toks, token{text: w, line: start})
		}
	}
	return toks, errs
}

func endsInBackslash(s string) bool {
	n := len(s) - len(strings.TrimRight(s, "\\"))
	return n%2 == 1
}

// extractFlags picks the flags in specs out of one file's words, in the
// forms pflag accepts: --flag=value and --flag value. pflag would take the
// next word as the value even if it starts with a dash; we call that a
// missing value, since no PEM path starts with one.
func extractFlags(source string, toks []token, specs map[string]flagSpec) ([]occurrence, []error) {
	var out []occurrence
	var errs []error
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if !strings.HasPrefix(t.text, "--") || t.text == "--" {
			continue
		}
		name, value, hasValue := strings.Cut(t.text[2:], "=")
		// kube-apiserver normalises _ to - in flag names.
		name = strings.ReplaceAll(name, "_", "-")
		if _, ok := specs[name]; !ok {
			continue
		}
		if !hasValue {
			if i+1 < len(toks) && !strings.HasPrefix(toks[i+1].text, "-") {
				i++
				value = toks[i].text
			} else {
				errs = append(errs, fmt.Errorf("%s:%d: --%s has no value", source, t.line, name))
				continue
			}
		}
		if value == "" && !specs[name].emptyUnset {
			errs = append(errs, fmt.Errorf("%s:%d: --%s has an empty value", source, t.line, name))
			continue
		}
		out = append(out, occurrence{flag: name, value: value, source: source, line: t.line})
	}
	return out, errs
}

// readFlags is the effective flags of every flags file, read in order as one command line.
func readFlags(paths []string, specs map[string]flagSpec) ([]occurrence, error) {
	var out []occurrence
	var errs []error
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("flags file: %w", err))
			continue
		}
		toks, terrs := tokenize(p, data)
		occ, ferrs := extractFlags(p, toks, specs)
		errs = append(errs, terrs...)
		errs = append(errs, ferrs...)
		out = append(out, occ...)
	}
	return effective(out, specs), errors.Join(errs...)
}

// effective applies pflag's rules: a repeated scalar flag keeps its last
// value, a repeatable one keeps them all. Order of first appearance is kept
// so reports read like the files.
func effective(occ []occurrence, specs map[string]flagSpec) []occurrence {
	last := map[string]int{}
	for i, o := range occ {
		last[o.flag] = i
	}
	var out []occurrence
	for i, o := range occ {
		if specs[o.flag].multi || last[o.flag] == i {
			out = append(out, o)
		}
	}
	return out
}
