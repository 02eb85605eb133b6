package docrun

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/testbin"
)

const (
	confdBin  = "confd"
	helperBin = "kube-apiserver-safe-restart"
	signerBin = "kube-apiserver-sa-signer"
)

var (
	buildOnce sync.Once
	binPaths  map[string]string
	buildErr  error
	cleanup   = func() {}
)

func TestMain(m *testing.M) {
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// bins builds the three shipped binaries once, as `make build` does.
func bins(t *testing.T) map[string]string {
	t.Helper()
	buildOnce.Do(func() {
		binPaths, cleanup, buildErr = testbin.Build(nil, map[string]string{
			confdBin:  "./cmd/confd",
			helperBin: "./cmd/kube-apiserver-safe-restart",
			signerBin: "./cmd/kube-apiserver-sa-signer",
		})
		if buildErr != nil {
			cleanup = func() {}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPaths
}

// run runs a built binary in an empty environment (no ETCDCTL_*, no
// CONFD_*: only what the command line and the files say counts).
func run(t *testing.T, name string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bins(t)[name], args...)
	cmd.Env = []string{"HOME=" + os.TempDir()}
	cmd.Dir = os.TempDir()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return code, o.String(), e.String()
}

// invocation is one command line of a shipped binary found in a document.
type invocation struct {
	where string   // file:line
	bin   string   // confdBin, helperBin or signerBin
	args  []string // placeholders filled in, up to a "--"
	text  string   // as written
}

// tomlSnippet is one configuration file or snippet found in a document.
type tomlSnippet struct {
	where string
	name  string // the file it is (or stands for), for the resource's and confd.toml's place
	data  string
}

const binNames = `(confd|kube-apiserver-safe-restart|kube-apiserver-sa-signer)`

var (
	// A binary in command position: at the start of a line of code, or
	// after a shell separator, a quote (a TOML command string, sh -c '...')
	// or a backquote (inline code), after sudo/exec/env and VAR=value.
	codeCommand = regexp.MustCompile("(^|[;&|`'\"]|\\$\\()\\s*(?:\\$\\s+)?(?:(?:sudo|exec|time|env)\\s+|[A-Z_][A-Z0-9_]*=\\S*\\s+)*(?:/usr/local/bin/|/usr/bin/|\\./bin/|bin/|\\./)?" + binNames + "(?:[ \\t]|$)")
	// In prose (Markdown text, comments) only inline code counts.
	proseCommand = regexp.MustCompile("(`)(?:/usr/local/bin/|/usr/bin/|\\./bin/|bin/|\\./)?" + binNames + "(?:[ \\t]|$)")
	// A TOML setting commented out: # check_cmd = "..."
	commentedSetting = regexp.MustCompile(`^\s*#\s*[a-z_-]+\s*=\s*["'\[]`)
	// A line break in prose, and the next line's indentation.
	proseBreak = regexp.MustCompile(`\n[ \t]*`)
	// A synopsis' metavariables that a flag's type refuses as they are.
	metavars = map[string]string{"D": "1h", "N": "1"}
	// systemd's specifiers as a unit on master m1 expands them.
	specifiers = strings.NewReplacer("%H", "m1.example.com", "%l", "m1", "%n", "unit.service", "%N", "unit", "%i", "inst", "%I", "inst", "%%", "%")
)

// docFiles are every file an operator copies command lines or
// configuration from, relative to the repository root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	md, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range md {
		files = append(files, filepath.Join("docs", filepath.Base(f)))
	}
	err = filepath.WalkDir(filepath.Join(root, "examples"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// lineAt is the 1-based line of offset off in s.
func lineAt(s string, off int) int { return strings.Count(s[:off], "\n") + 1 }

// scan finds the command lines re matches in s, whose offset 0 is at
// offset base of the file text.
func scan(re *regexp.Regexp, file, text string, base int, s string) []invocation {
	var out []invocation
	for _, m := range re.FindAllStringSubmatchIndex(s, -1) {
		rest := s[m[1]:]
		if m[1] > m[0] && (s[m[1]-1] == ' ' || s[m[1]-1] == '\t') {
			rest = s[m[1]-1:]
		}
		// Inside a quoted string or inline code, the command ends where it does.
		if m[3] > m[2] {
			if q := s[m[2]]; q == '\'' || q == '"' || q == '`' {
				if i := strings.IndexByte(rest, q); i >= 0 {
					rest = rest[:i]
				}
			}
		}
		words, used := shellWords(rest)
		out = append(out, invocation{
			where: fmt.Sprintf("%s:%d", file, lineAt(text, base+m[0])),
			bin:   s[m[4]:m[5]],
			args:  synopsis(words),
			text:  strings.TrimSpace(s[m[4]:m[5]] + used),
		})
	}
	return out
}

// shellWords splits a command's arguments as a shell would, up to the end
// of the command (a separator, a redirection, a comment, an unbalanced
// quote). $(...) is a host name; $VAR words, empty or site overrides in
// every example, are left out.
func shellWords(s string) (words []string, used string) {
	var cur strings.Builder
	in, dollar := false, false
	flush := func() {
		if in && !dollar {
			words = append(words, cur.String())
		}
		cur.Reset()
		in, dollar = false, false
	}
	i := 0
loop:
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c == 0:
			// what a joined continuation left (see joinLines)
		case strings.HasPrefix(s[i:], "   "):
			// A synopsis' description column.
			break loop
		case c == ' ' || c == '\t' || c == '\n':
			flush()
		case c == '\\' && i+1 < len(s):
			i++
			if s[i] != '\n' {
				cur.WriteByte(s[i])
				in = true
			}
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				break loop
			}
			cur.WriteString(s[i+1 : i+1+j])
			in = true
			i += j + 1
		case c == '$' && i+1 < len(s) && s[i+1] == '(':
			j := strings.IndexByte(s[i:], ')')
			if j < 0 {
				break loop
			}
			cur.WriteString("m1.example.com")
			in = true
			i += j
		case c == '$' && !in:
			in, dollar = true, true
		case strings.IndexByte(";&|)`<>", c) >= 0:
			break loop
		case c == '#' && !in:
			break loop
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	flush()
	return words, s[:i]
}

// synopsis turns a synopsis into a command line: an optional group
// ([--flag X]) is given, one without a flag ([FILE...], [restart flags])
// left out, metavariables a flag's type refuses (D, N) filled in, and
// template actions ({{.src}}) are a file. What follows "--" is the
// restart command, not the helper's.
func synopsis(words []string) []string {
	var out []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "[") {
			depth, j, flag := 0, i, false
			for ; j < len(words); j++ {
				depth += strings.Count(words[j], "[") - strings.Count(words[j], "]")
				flag = flag || strings.HasPrefix(strings.TrimLeft(words[j], "["), "-")
				if depth <= 0 {
					break
				}
			}
			if !flag {
				i = j
				continue
			}
		}
		w = strings.TrimSuffix(strings.Trim(w, "[]"), "...")
		switch {
		case w == "" && words[i] != "":
			continue
		case w == "--":
			return out
		case strings.Contains(w, "{{") || strings.Contains(w, "<%"):
			w = "FILE"
		case metavars[w] != "":
			w = metavars[w]
		}
		out = append(out, w)
	}
	return out
}

// extract finds every command line and configuration snippet of a file.
func extract(t *testing.T, root, file string) ([]invocation, []tomlSnippet) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	var invs []invocation
	var snippets []tomlSnippet
	base := filepath.Base(file)
	switch {
	case strings.HasSuffix(file, ".md"):
		// Fenced blocks are code; the text between them prose, whose
		// inline code may break across lines.
		fence := regexp.MustCompile("(?m)^ *```([a-z]*)\n((?s:.*?))^ *```")
		last := 0
		prose := func(end int) {
			p := proseBreak.ReplaceAllStringFunc(text[last:end], func(m string) string {
				return " " + strings.Repeat("\x00", len(m)-1)
			})
			invs = append(invs, scan(proseCommand, file, text, last, p)...)
		}
		for _, m := range fence.FindAllStringSubmatchIndex(text, -1) {
			prose(m[0])
			last = m[1]
			lang, body := text[m[2]:m[3]], text[m[4]:m[5]]
			if lang == "toml" {
				snippets = append(snippets, tomlSnippet{fmt.Sprintf("%s:%d", file, lineAt(text, m[4])), "snippet.toml", body})
			}
			if lang == "json" {
				continue
			}
			invs = append(invs, scanCode(file, text, m[4], body, lang == "toml")...)
		}
		prose(len(text))
	case strings.HasSuffix(file, ".epp"):
		rendered := renderEPP(t, file, text)
		// Lines keep their numbers: the header line becomes empty.
		invs = append(invs, scanCode(file, rendered, 0, rendered, true)...)
		snippets = append(snippets, tomlSnippet{file, strings.TrimSuffix(base, ".epp"), rendered})
	case isUnit(file):
		unit := joinLines(text)
		off := 0
		for _, line := range strings.SplitAfter(unit, "\n") {
			trimmed := strings.TrimSpace(line)
			k, v, ok := strings.Cut(trimmed, "=")
			switch {
			case strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";"):
				invs = append(invs, scan(proseCommand, file, text, off, line)...)
			case ok && strings.HasPrefix(k, "Exec"):
				// systemd's prefixes: - (failure ignored), @, +, !, :
				v = strings.TrimLeft(v, "-@+!:")
				start := off + strings.Index(line, "=") + 1
				invs = append(invs, scan(codeCommand, file, text, start, specifiers.Replace(v))...)
			}
			off += len(line)
		}
	case slices.Contains([]string{".json", ".yaml", ".yml"}, filepath.Ext(file)):
		// Data, not shell: its strings are prose (alert texts, panel
		// titles), and only inline code in them is a command line.
		invs = append(invs, scan(proseCommand, file, text, 0, text)...)
	default:
		if strings.HasSuffix(file, ".toml") {
			snippets = append(snippets, tomlSnippet{file, base, text})
		}
		invs = append(invs, scanCode(file, text, 0, text, strings.HasSuffix(file, ".toml"))...)
	}
	return invs, snippets
}

// joinLines joins continuation lines (a backslash at the end) into one,
// the next line's indentation dropped; the text keeps its length (NULs
// stand in for what went, and shellWords skips them), so that offsets
// still name the file's lines.
func joinLines(s string) string {
	return regexp.MustCompile(`\\\n[ \t]*`).ReplaceAllStringFunc(s, func(m string) string {
		return " " + strings.Repeat("\x00", len(m)-1)
	})
}

func isUnit(file string) bool {
	switch filepath.Ext(file) {
	case ".service", ".timer", ".path", ".socket":
		return true
	case ".conf":
		return strings.HasSuffix(filepath.Dir(file), ".d")
	}
	return false
}

// scanCode reads code line by line (continuations joined): comments are
// prose, the rest code.
func scanCode(file, text string, base int, code string, tomlComments bool) []invocation {
	var out []invocation
	joined := joinLines(code)
	off := 0
	for _, line := range strings.SplitAfter(joined, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case tomlComments && commentedSetting.MatchString(line):
			// A setting commented out, for the operator to take instead.
			out = append(out, scan(codeCommand, file, text, base+off, line)...)
		case strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "//"):
			out = append(out, scan(proseCommand, file, text, base+off, line)...)
		case tomlComments && strings.Contains(line, " # "):
			// A TOML value's comment is prose.
			i := strings.Index(line, " # ")
			out = append(out, scan(codeCommand, file, text, base+off, line[:i])...)
			out = append(out, scan(proseCommand, file, text, base+off+i, line[i:])...)
		default:
			out = append(out, scan(codeCommand, file, text, base+off, line)...)
		}
		off += len(line)
	}
	return out
}

// eppValues are representative values of the Puppet templates' parameters.
var eppValues = map[string]string{
	"ca":   "/etc/kubernetes/pki/etcd/ca.crt",
	"cert": "/etc/kubernetes/pki/apiserver-etcd-client.crt",
	"key":  "/etc/kubernetes/pki/apiserver-etcd-client.key",
}

// renderEPP renders a Puppet template as Puppet would with representative
// values: the parameter header goes (its line stays, empty), each <%= %>
// tag becomes its value; the node list becomes one node.
func renderEPP(t *testing.T, file, text string) string {
	t.Helper()
	if strings.HasPrefix(text, "<%- |") {
		_, rest, _ := strings.Cut(text, "\n")
		text = "\n" + rest
	}
	tag := regexp.MustCompile(`<%=\s*(.*?)\s*%>`)
	out := tag.ReplaceAllStringFunc(text, func(m string) string {
		expr := tag.FindStringSubmatch(m)[1]
		if strings.HasPrefix(expr, "$nodes") {
			return `"https://127.0.0.1:2379"`
		}
		v, ok := eppValues[strings.TrimPrefix(expr, "$")]
		if !ok {
			t.Errorf("%s: no representative value for %s: add one to eppValues", file, m)
		}
		return v
	})
	if strings.Contains(out, "<%") {
		t.Errorf("%s: a template tag this test does not render is left: %s", file, out)
	}
	return out
}

// collect is every command line and snippet of every document.
func collect(t *testing.T) (string, []invocation, []tomlSnippet) {
	t.Helper()
	root := etcdtest.RepoRoot()
	var invs []invocation
	var snippets []tomlSnippet
	for _, f := range docFiles(t, root) {
		i, s := extract(t, root, f)
		invs = append(invs, i...)
		snippets = append(snippets, s...)
	}
	return root, invs, snippets
}

// boolFlags are the flags of a binary's --help output that take no value.
func boolFlags(help string) map[string]bool {
	out := map[string]bool{"h": true, "help": true}
	for _, m := range regexp.MustCompile(`--([a-z0-9-]+)\[=true\|false\]`).FindAllStringSubmatch(help, -1) {
		out[m[1]] = true
	}
	return out
}

// positionals are the arguments of a command line that are no flag and
// no flag's value.
func positionals(args []string, bools map[string]bool) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			out = append(out, a)
			continue
		}
		name := strings.TrimLeft(a, "-")
		if !strings.Contains(name, "=") && !bools[name] {
			i++
		}
	}
	return out
}

// Every command line of the three binaries in README.md, docs/*.md and
// examples/** is one the binary parses: each is run with --help added, so
// that the binary parses every flag (and, for the helper, the subcommand)
// and exits 2 on an unknown one or a bad value, and runs nothing. confd
// and the signer take no argument, which --help does not check: the test
// does, from the flags --help lists as taking no value.
func TestDocCommandLinesParse(t *testing.T) {
	_, invs, _ := collect(t)
	bools := map[string]map[string]bool{}
	for _, b := range []string{confdBin, signerBin} {
		_, out, errs := run(t, b, "--help")
		bools[b] = boolFlags(out + errs)
	}
	_, rootHelp, _ := run(t, helperBin, "--help")
	subcommands := regexp.MustCompile(`(?m)^  ([a-z-]+) `).FindAllStringSubmatch(rootHelp[strings.Index(rootHelp, "Available Commands:"):], -1)
	count := map[string]int{}
	for _, inv := range invs {
		if len(inv.args) == 0 || notOurs(inv) {
			continue
		}
		count[inv.bin]++
		args := slices.Clone(inv.args)
		// --help with no subcommand is the root's, which knows none of
		// restart's flags: a line without one is a restart (the default).
		if inv.bin == helperBin && !slices.ContainsFunc(subcommands, func(m []string) bool { return slices.Contains(args, m[1]) }) {
			args = append([]string{"restart"}, args...)
		}
		code, _, errs := run(t, inv.bin, append(args, "--help")...)
		if code != 0 {
			t.Errorf("%s: %s: %s exits %d: %s", inv.where, inv.text, inv.bin, code, strings.TrimSpace(errs))
			continue
		}
		if inv.bin != helperBin {
			if p := positionals(inv.args, bools[inv.bin]); len(p) > 0 {
				t.Errorf("%s: %s: %s takes no argument, given %q", inv.where, inv.text, inv.bin, p)
			}
		}
	}
	t.Logf("command lines parsed: %v", count)
	// What the documents held when this test was written, less a margin:
	// a parser that finds less is broken, not the documents shorter.
	for bin, least := range map[string]int{helperBin: 50, confdBin: 18, signerBin: 1} {
		if count[bin] < least {
			t.Errorf("only %d command lines of %s found (want at least %d): the extraction is broken", count[bin], bin, least)
		}
	}
}

// notOurs are command lines in the documents that are not an operator's
// of our binaries: confd's internal guard process, and the other confd
// fork's command line the bench compares with.
func notOurs(inv invocation) bool {
	return inv.bin == confdBin && (inv.args[0] == "__group-guard" ||
		strings.HasPrefix(inv.where, "docs/performance.md:") && slices.Contains(inv.args, "etcd"))
}

// resourceKeys are the keys of a confd template resource's [template].
var resourceKeys = []string{"src", "dest", "keys", "prefix", "mode", "owner", "group", "uid", "gid", "check_cmd", "reload_cmd", "check_cmd_timeout", "reload_cmd_timeout", "wait"}

// Every configuration snippet and file of the documents and examples is
// loaded by the binary that reads it: the helpers' flat file by
// `kube-apiserver-safe-restart config` and by the signer (which has no
// such subcommand: it is started with a --socket it refuses, so that it
// stops after reading and validating the file), confd.toml and template
// resources by `confd -check-config` in a confdir built around them, and
// each example confdir as it is.
func TestDocConfigurationLoads(t *testing.T) {
	root, _, snippets := collect(t)
	count := map[string]int{}
	for _, s := range snippets {
		var m map[string]any
		if _, err := toml.Decode(s.data, &m); err != nil {
			t.Errorf("%s: not TOML: %v", s.where, err)
			continue
		}
		_, isResource := m["template"]
		// The helpers' file, or a snippet of it: mostly their keys (a
		// misspelt one must not make it a confd.toml).
		fragment, helperKeys := false, 0
		for k := range m {
			fragment = fragment || slices.Contains(resourceKeys, k)
			if _, ok := config.Lookup(k); ok {
				helperKeys++
			}
		}
		helper := s.name == "safe-restart.toml" || helperKeys > len(m)/2
		switch {
		case strings.Contains(filepath.ToSlash(s.where), "/conf.d/"):
			// An example confdir's resource: checked with its confdir below.
		case isResource || fragment:
			count["resource"]++
			checkResource(t, root, s, !isResource)
		case helper:
			count["helper"]++
			checkHelperConfig(t, s)
		case s.name == "confd.toml" && strings.HasPrefix(s.where, "examples/") && !strings.HasSuffix(s.where, ".epp"):
			// An example confdir's confd.toml: checked with its confdir below.
		default:
			count["confd.toml"]++
			path := filepath.Join(t.TempDir(), "confd.toml")
			writeFile(t, path, s.data)
			checkConfdir(t, s.where, filepath.Join(root, "examples", "confd"), path)
		}
	}
	// Every example confdir, as installed.
	err := filepath.WalkDir(filepath.Join(root, "examples"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "conf.d" {
			dir := filepath.Dir(path)
			rel, _ := filepath.Rel(root, dir)
			count["confdir"]++
			checkConfdir(t, rel, dir, filepath.Join(dir, "confd.toml"))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("configurations loaded: %v", count)
	for kind, least := range map[string]int{"helper": 4, "confd.toml": 1, "resource": 2, "confdir": 2} {
		if count[kind] < least {
			t.Errorf("only %d %s configurations found (want at least %d): the extraction is broken", count[kind], kind, least)
		}
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkConfdir runs confd -check-config on a confdir with a confd.toml.
func checkConfdir(t *testing.T, where, dir, confdToml string) {
	t.Helper()
	code, out, errs := run(t, confdBin, "-check-config", "-confdir", dir, "-config-file", confdToml)
	if code != 0 || strings.Contains(out+errs, "WARN") {
		t.Errorf("%s: confd -check-config exits %d:\n%s%s", where, code, out, errs)
	}
}

// checkResource puts a template resource (a fragment of one: its
// [template] keys, with a representative src, dest and keys where the
// fragment has none) in a confdir of its own with the template it names,
// from the examples when there is one, and checks that confdir.
func checkResource(t *testing.T, root string, s tomlSnippet, fragment bool) {
	t.Helper()
	data := s.data
	var r struct {
		Template struct {
			Src  string
			Dest string
			Keys []string
		}
	}
	if fragment {
		var m map[string]any
		_, _ = toml.Decode(data, &m)
		head := "[template]\n"
		for k, v := range map[string]string{"src": `"doc.tmpl"`, "dest": `"/tmp/doc.out"`, "keys": `["/doc"]`} {
			if _, ok := m[k]; !ok {
				head += k + " = " + v + "\n"
			}
		}
		data = head + data
	}
	if _, err := toml.Decode(data, &r); err != nil {
		t.Errorf("%s: %v", s.where, err)
		return
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "confd.toml"), "")
	writeFile(t, filepath.Join(dir, "conf.d", "doc.toml"), data)
	tmpl := "{{/* a template of the documents */}}\n"
	if b, err := os.ReadFile(filepath.Join(root, "examples", "confd", "templates", r.Template.Src)); err == nil {
		tmpl = string(b)
	}
	writeFile(t, filepath.Join(dir, "templates", r.Template.Src), tmpl)
	checkConfdir(t, s.where, dir, filepath.Join(dir, "confd.toml"))
}

// checkHelperConfig loads a helper configuration with both helpers.
func checkHelperConfig(t *testing.T, s tomlSnippet) {
	t.Helper()
	path := filepath.Join(t.TempDir(), s.name)
	writeFile(t, path, s.data)
	if code, _, errs := run(t, helperBin, "config", "--config", path); code != 0 || errs != "" {
		t.Errorf("%s: %s config --config exits %d: %s", s.where, helperBin, code, strings.TrimSpace(errs))
	}
	// The settings it shows commented out, for the operator to take, load
	// too once taken.
	if on := uncomment(s.data); on != s.data {
		taken := filepath.Join(t.TempDir(), s.name)
		writeFile(t, taken, on)
		if code, _, errs := run(t, helperBin, "config", "--config", taken); code != 0 || errs != "" {
			t.Errorf("%s, its commented settings taken: %s config --config exits %d: %s", s.where, helperBin, code, strings.TrimSpace(errs))
		}
	}
	want := signerBin + `: --socket "relative": want an absolute path`
	code, _, errs := run(t, signerBin, "--config", path, "--socket", "relative")
	if first, _, _ := strings.Cut(errs, "\n"); code != 2 || first != want {
		t.Errorf("%s: %s --config exits %d (want 2 and only the refused --socket: the file read and valid): %s", s.where, signerBin, code, strings.TrimSpace(errs))
	}
}

// uncomment takes every setting a configuration shows commented out.
func uncomment(data string) string {
	lines := strings.SplitAfter(data, "\n")
	for i, l := range lines {
		if commentedSetting.MatchString(l) {
			_, after, _ := strings.Cut(l, "#")
			lines[i] = strings.TrimLeft(after, " \t")
		}
	}
	return strings.Join(lines, "")
}
