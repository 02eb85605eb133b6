package saferestart

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

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
