package saferestart

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// docFiles are where operators copy command lines and configuration from.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../README.md"}
	files = append(files, globs(t, "../docs/*.md")...)
	err := filepath.WalkDir("../examples", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Every flag a command line in README, docs or examples gives the helper
// is a flag of the subcommand it names (restart when it names none, with
// flags before the subcommand allowed), and every subcommand exists:
// moving to per-command flags broke none of them. Synopses ([--flag]) and
// prose (`... status` shows) are read the same way.
func TestDocCommandLinesParse(t *testing.T) {
	names := map[string]bool{}
	for _, c := range commands(&cmdkit.Shared{}) {
		names[c.name] = true
	}
	flagsOf := map[string]map[string]bool{}
	for name := range names {
		flagsOf[name] = map[string]bool{}
		for _, f := range commandFlags(t, name) {
			flagsOf[name][f] = true
		}
	}
	end := regexp.MustCompile("[`\"'#|]")
	checked := 0
	for _, path := range docFiles(t) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			for _, part := range strings.Split(line, cmdkit.ProgName+" ")[1:] {
				if i := end.FindStringIndex(part); i != nil {
					part = part[:i[0]]
				}
				sub, plain := cmdRestart, false
				for _, w := range strings.Fields(part) {
					if strings.HasPrefix(w, "(") || strings.HasPrefix(w, "$") {
						break
					}
					w = strings.Trim(w, "[],.;:)")
					switch {
					case strings.HasPrefix(w, "--") && len(w) > 2:
						name, _, _ := strings.Cut(w[2:], "=")
						if !flagsOf[sub][name] {
							t.Errorf("%s:%d: --%s is not a flag of %s: %s", path, n, name, sub, line)
						}
						checked++
					case w == "--":
						plain = true // the restart command follows
					case !plain && !strings.HasPrefix(w, "-"):
						plain = true
						if names[w] {
							sub = w
						}
					}
				}
			}
		}
		f.Close()
	}
	t.Logf("%d flags checked", checked)
	if checked < 20 {
		t.Fatalf("only %d flags checked: the docs' layout changed under this test", checked)
	}
}

// Every key of a configuration file in examples, and of a TOML block in
// README or docs that has no [section] (a resource's), is a key the
// helpers read.
func TestDocConfigKeysKnown(t *testing.T) {
	key := regexp.MustCompile(`^([a-z][a-z0-9-]*)\s*=`)
	checked := 0
	check := func(where string, lines []string) {
		for _, l := range lines {
			if m := key.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
				if _, ok := config.Lookup(m[1]); !ok {
					t.Errorf("%s: key %q is not in config.Keys", where, m[1])
				}
				checked++
			}
		}
	}
	for _, path := range globs(t, "../examples/safe-restart.toml", "../examples/*/safe-restart.toml") {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		check(path, strings.Split(string(data), "\n"))
	}
	for _, path := range append([]string{"../README.md"}, globs(t, "../docs/*.md")...) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks := strings.Split(string(data), "```")
		for i := 1; i < len(blocks); i += 2 {
			b := blocks[i]
			if !strings.HasPrefix(b, "toml") || strings.Contains(b, "\n[") {
				continue
			}
			check(path, strings.Split(b, "\n")[1:])
		}
	}
	t.Logf("%d keys checked", checked)
	if checked < 10 {
		t.Fatalf("only %d keys checked", checked)
	}
}

// commandFlags are the names of the flags a subcommand takes, the
// shared ones included.
func commandFlags(t *testing.T, name string) []string {
	t.Helper()
	var out strings.Builder
	p := &cli.Program{Name: cmdkit.ProgName, Stdout: &out, Stderr: &out, LookupEnv: env(nil)}
	root := newRoot(p, &cmdkit.Shared{}, func(string, options) int { return cmdkit.ExitOK })
	c, _, err := root.Find([]string{name})
	if err != nil || c == root {
		t.Fatalf("no command %s: %v", name, err)
	}
	var names []string
	c.LocalFlags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	c.InheritedFlags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	return names
}
