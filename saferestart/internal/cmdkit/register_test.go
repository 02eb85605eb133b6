package cmdkit

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// A tagged field Register cannot register must stop the command at
// start-up, not leave it without the flag.
func TestRegisterRefusesWhatItCannotRegister(t *testing.T) {
	for name, o := range map[string]any{
		"no row in flagDefs": &struct {
			X string `flag:"no-such-flag"`
		}{},
		"has no case": &struct {
			X float64 `flag:"ttl"`
		}{},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), name) {
					t.Errorf("recovered %v, want a panic naming %q", r, name)
				}
			}()
			Register(pflag.NewFlagSet("x", pflag.ContinueOnError), o)
		})
	}
	var o struct {
		TTLFlag
		Reason string `flag:"reason"`
	}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	Register(fs, &o)
	if fs.Lookup("ttl") == nil || fs.Lookup("reason") == nil {
		t.Error("ttl (embedded group) or reason not registered")
	}
}
