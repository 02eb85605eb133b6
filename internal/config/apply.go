package config

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Apply sets each flag of fs that f has a value for, unless the flag was
// given on the command line (fs.Changed) or use(name) is false (a key
// the subcommand does not use). Keys fs has no flag for belong to another
// binary and are skipped. The flags set are not marked changed, so that an
// environment variable applied afterwards still beats the file. It returns
// the names it set.
func (f *File) Apply(fs *pflag.FlagSet, use func(name string) bool) ([]string, error) {
	var set []string
	for _, k := range Keys { // a fixed order: errors and results are stable
		v, ok := f.Values[k.Name]
		fl := fs.Lookup(k.Name)
		if !ok || fl == nil || fl.Changed || (use != nil && !use(k.Name)) {
			continue
		}
		var err error
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			err = sv.Replace(v.Items)
		} else if len(v.Items) == 1 {
			err = fl.Value.Set(v.Items[0])
		} else {
			err = fmt.Errorf("want one value, got %d", len(v.Items))
		}
		if err != nil {
			// The value is not quoted: it may be a password.
			return set, fmt.Errorf("%s: %s: %w", v.where(f.Path), k.Name, err)
		}
		set = append(set, k.Name)
	}
	return set, nil
}

// Mask hides a secret value for printing: a user's "name:password" keeps
// the name.
func Mask(k Key, value string) string {
	if !k.Secret || value == "" {
		return value
	}
	if k.Name == "user" {
		if name, _, ok := strings.Cut(value, ":"); ok {
			return name + ":****"
		}
		return value
	}
	return "****"
}
