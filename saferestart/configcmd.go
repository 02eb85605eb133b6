package saferestart

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// Run is the `config` subcommand: every setting as a TOML line with
// where its value came from (flag, env NAME, FILE:LINE, default), secrets
// masked. The output is itself a valid configuration file.
func (o *configCmd) Run(_ context.Context, e *cmdkit.Env) int {
	w, fs := e.Stdout, o.fs
	switch {
	case o.Shared.File != nil:
		fmt.Fprintf(w, "# configuration file: %s\n", o.Shared.File.Path)
	case o.Shared.ConfigPath == "":
		fmt.Fprintf(w, "# configuration file: none (--config '')\n")
	default:
		fmt.Fprintf(w, "# configuration file: none (%s does not exist)\n", o.Shared.ConfigPath)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if slices.Contains(config.CommandLineOnly, f.Name) {
			return
		}
		k, _ := config.Lookup(f.Name) // not a key: a plain string, shown as it is
		fmt.Fprintf(w, "%s = %s  # %s\n", f.Name, tomlValue(k, f, o.Shared), o.Shared.Origin[f.Name])
	})
	if o.Shared.File != nil {
		var other []string
		for _, k := range config.Keys {
			if v, ok := o.Shared.File.Values[k.Name]; ok && fs.Lookup(k.Name) == nil {
				other = append(other, fmt.Sprintf("# %s = %s  # %s", k.Name, quoteItems(k, v.Items), o.Shared.File.Where(k.Name)))
			}
		}
		if len(other) > 0 {
			fmt.Fprintf(w, "# Not read by this %s (keys of the other binaries or of other versions):\n%s\n", cmdkit.ProgName, strings.Join(other, "\n"))
		}
	}
	return cmdkit.ExitOK
}

// tomlValue formats a flag's effective value. user is not masked: an
// ETCDCTL_USER of name:password was split into user and password.
func tomlValue(k config.Key, f *pflag.Flag, o *cmdkit.Shared) string {
	if f.Name == "user" {
		return strconv.Quote(o.User)
	}
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return quoteItems(k, sv.GetSlice())
	}
	return quoteItems(k, []string{f.Value.String()})
}

func quoteItems(k config.Key, items []string) string {
	if k.Kind != config.List && len(items) == 1 {
		if k.Kind == config.Int || k.Kind == config.Bool {
			return items[0]
		}
		return strconv.Quote(config.Mask(k, items[0]))
	}
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = strconv.Quote(config.Mask(k, s))
	}
	return "[" + strings.Join(q, ", ") + "]"
}
