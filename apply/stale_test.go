package apply

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/keysync/confd/resource"
)

// TestRemoveStaleStageFiles removes only files named as stage files of
// the destinations, each directory listed once for all resources in it.
func TestRemoveStaleStageFiles(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	rs := []*resource.Resource{
		{File: "r.toml", Dest: filepath.Join(dir, "out.conf")},
		{File: "s.toml", Dest: filepath.Join(dir, "a.b")},
		{File: "t.toml", Dest: filepath.Join(other, "x")},
		{File: "u.toml", Dest: filepath.Join(t.TempDir(), "gone", "y")}, // no directory: nothing to do
	}
	names := map[string]bool{
		dir + "/.out.conf.0123456789ab":               true,
		dir + "/.out.conf.fedcba987654":               true,
		dir + "/.out.conf.zz23456789ab":               false,
		dir + "/.out.conf.0123456789abc":              false,
		dir + "/.out.conf.0123456789AB":               false,
		dir + "/.out.conf.keep":                       false,
		dir + "/.out.conf.confd-rejected":             false,
		dir + "/.other.0123456789ab":                  false,
		dir + "/out.conf.0123456789ab":                false,
		dir + "/out.conf":                             false,
		dir + "/.a.b.0123456789ab":                    true,
		dir + "/..confd-reload-owed.a.b.0123456789ab": true, // the record's, cut short
		dir + "/..a.b.confd-previous.0123456789ab":    true, // the in-place copy's
		dir + "/.confd-reload-owed.a.b":               false,
		dir + "/.a.0123456789ab":                      false, // "a" is no destination here
		dir + "/.x.0123456789ab":                      false, // x is written in the other directory
		other + "/.x.0123456789ab":                    true,
		other + "/.out.conf.0123456789ab":             false,
	}
	for n := range names {
		if err := os.WriteFile(n, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, errs := RemoveStaleStageFiles(rs, filepath.Join(t.TempDir(), "locks"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	got := map[string]string{}
	for _, f := range removed {
		got[f.Path] = f.Resource.File
	}
	want := map[string]string{
		dir + "/.out.conf.0123456789ab": "r.toml", dir + "/.out.conf.fedcba987654": "r.toml",
		dir + "/.a.b.0123456789ab": "s.toml", dir + "/..confd-reload-owed.a.b.0123456789ab": "s.toml",
		dir + "/..a.b.confd-previous.0123456789ab": "s.toml", other + "/.x.0123456789ab": "t.toml",
	}
	if !maps.Equal(got, want) {
		t.Errorf("removed %v, want %v", got, want)
	}
	for n, gone := range names {
		_, err := os.Stat(n)
		if gone != os.IsNotExist(err) {
			t.Errorf("%s: removed %v, want %v", n, os.IsNotExist(err), gone)
		}
	}
}
