package version

import (
	"runtime/debug"
	"testing"
)

// `go install .../cmd/confd@v1.2.3` reports 1.2.3; the Makefile's stamp
// and a build in a checkout ("(devel)") are left as they are.
func TestModuleVersion(t *testing.T) {
	for _, c := range []struct{ stamped, module, want string }{
		{"dev", "v1.2.3", "1.2.3"},
		{"dev", "v0.0.0-20240102030405-0123456789ab", "0.0.0-20240102030405-0123456789ab"},
		{"dev", "(devel)", "dev"},
		{"dev", "", "dev"},
		{"1.2.3+4.gabc", "v1.2.3", "1.2.3+4.gabc"},
	} {
		if got := moduleVersion(c.stamped, debug.Module{Path: "github.com/keysync/confd", Version: c.module}); got != c.want {
			t.Errorf("moduleVersion(%q, %q) = %q, want %q", c.stamped, c.module, got, c.want)
		}
	}
}
