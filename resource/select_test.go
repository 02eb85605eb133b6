package resource

import (
	"path/filepath"
	"strings"
	"testing"
)

// A mixed confdir: -resource picks files by their path under conf.d, with
// or without ".toml", and never parses the others.
func TestLoadNamedMixedConfdir(t *testing.T) {
	good := "[template]\nsrc = \"t.tmpl\"\ndest = \"/tmp/x\"\nkeys = [\"/a\"]\n"
	dir := confDir(t, map[string]string{
		"good.toml":       good,
		"broken.toml":     "[template\nsrc=",
		"sub/nested.toml": good,
		"goodish.toml":    good,
	}, map[string]string{"t.tmpl": "x"})
	base := func(rs []*Resource) []string {
		var out []string
		for _, r := range rs {
			rel, _ := filepath.Rel(filepath.Join(dir, "conf.d"), r.File)
			out = append(out, rel)
		}
		return out
	}
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"good"}, "good.toml"},
		{[]string{"good.toml"}, "good.toml"},
		{[]string{"sub/nested", "good"}, "good.toml,sub/nested.toml"},
		{[]string{"./sub/nested.toml"}, "sub/nested.toml"},
	} {
		s, _ := testSettings(dir)
		rs, errs := LoadNamed(s, tc.names)
		if len(errs) != 0 || strings.Join(base(rs), ",") != tc.want {
			t.Errorf("LoadNamed(%q) = %q, %v; want %q and no error", tc.names, base(rs), errs, tc.want)
		}
	}
	s, _ := testSettings(dir)
	rs, errs := LoadNamed(s, []string{"good", "nope"})
	if len(rs) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "-resource nope") {
		t.Errorf("LoadNamed(good, nope) = %q, %v; want good and an error naming nope", base(rs), errs)
	}
	if _, errs := LoadNamed(s, []string{"broken"}); len(errs) != 1 || !strings.Contains(errs[0].Error(), "broken.toml:") {
		t.Errorf("LoadNamed(broken) errors = %v", errs)
	}
	if rs, errs := LoadNamed(s, nil); len(rs) != 3 || len(errs) != 1 {
		t.Errorf("LoadNamed(all) = %d resources, %v", len(rs), errs)
	}
}
