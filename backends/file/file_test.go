package file

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func get(t *testing.T, paths []string, filter string, keys ...string) map[string]string {
	t.Helper()
	c, err := New(paths, filter)
	if err != nil {
		t.Fatal(err)
	}
	got, rev, err := c.GetValues(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	if rev != 0 {
		t.Errorf("revision = %d, want 0", rev)
	}
	return got
}

func TestValueTypes(t *testing.T) {
	got := get(t, []string{"testdata/types.yaml"}, "", "/")
	want := map[string]string{
		"/app/name":          "demo",
		"/app/port":          "8080",
		"/app/negative":      "-3",
		"/app/hex":           "31",
		"/app/octal":         "511",
		"/app/underscores":   "1000",
		"/app/huge":          "18446744073709551615",
		"/app/ratio":         "0.5",
		"/app/trailing_zero": "1.5",
		"/app/exponent":      "1000",
		"/app/infinity":      "+Inf",
		"/app/enabled":       "true",
		"/app/disabled":      "false",
		"/app/yes_word":      "true",
		"/app/off_word":      "false",
		"/app/quoted_yes":    "yes",
		"/app/quoted_int":    "8080",
		"/app/tagged_str":    "42",
		"/app/date":          "2018-06-01",
		"/app/stamp":         "2018-06-01T10:00:00Z",
		"/app/empty_string":  "",
		"/app/block":         "line one\nline two\n",
		// nulls (nothing, tilde, servers/2) and empty collections give no key.
		"/app/nested/deeper/leaf": "v",
		"/app/servers/0":          "alpha",
		"/app/servers/1":          "10",
		"/app/servers/3/host":     "beta",
		"/app/servers/3/port":     "81",
		"/app/servers/4/0":        "x",
		"/app/servers/4/1":        "true", // a plain y is a YAML 1.1 boolean
		"/80":                     "port as key",
		"/slash/in/key":           "s",
	}
	if !maps.Equal(got, want) {
		diff(t, got, want)
	}
}

func TestMergeKeys(t *testing.T) {
	got := get(t, []string{"testdata/merge.yaml"}, "", "/dev", "/multi")
	want := map[string]string{
		"/dev/adapter": "postgres", "/dev/host": "devhost", "/dev/pool": "5",
		// Of a list of merged maps the first wins, as in yaml.v2.
		"/multi/adapter": "postgres", "/multi/host": "localhost", "/multi/pool": "9", "/multi/timeout": "3",
	}
	if !maps.Equal(got, want) {
		diff(t, got, want)
	}
}

func TestJSON(t *testing.T) {
	got := get(t, []string{"testdata/service.json"}, "", "/service")
	want := map[string]string{
		"/service/name": "json-demo", "/service/replicas": "3", "/service/weight": "2.25",
		"/service/public": "false", "/service/tags/0": "a", "/service/tags/1": "b",
	}
	if !maps.Equal(got, want) {
		diff(t, got, want)
	}
}

func TestEveryDocument(t *testing.T) {
	got := get(t, []string{"testdata/multidoc.yaml"}, "", "/")
	if want := map[string]string{"/first": "1", "/second": "2"}; !maps.Equal(got, want) {
		diff(t, got, want)
	}
}

func TestKeyFilter(t *testing.T) {
	paths := []string{"testdata/types.yaml"}
	for _, tc := range []struct {
		name string
		keys []string
		want []string
	}{
		{"path not string prefix", []string{"/app/servers/3"}, []string{"/app/servers/3/host", "/app/servers/3/port"}},
		{"exact leaf", []string{"/app/port"}, []string{"/app/port"}},
		{"leaf is not a prefix of its sibling", []string{"/app/name", "/app/nega"}, []string{"/app/name"}},
		{"several", []string{"/80", "/slash"}, []string{"/80", "/slash/in/key"}},
		{"none", []string{"/missing"}, nil},
		{"no keys", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := get(t, paths, "", tc.keys...)
			var keys []string
			for k := range got {
				keys = append(keys, k)
			}
			if !sameSet(keys, tc.want) {
				t.Errorf("keys for %q = %q, want %q", tc.keys, keys, tc.want)
			}
		})
	}
}

func TestDirectoriesAndFilter(t *testing.T) {
	for _, tc := range []struct {
		filter string
		want   map[string]string
	}{
		{"", map[string]string{
			"/tree/a": "from a.yaml", "/tree/b": "from b.json", "/tree/c": "from sub/c.yml",
			"/tree/d":     "in a directory whose name matches no filter, still searched",
			"/tree/notes": "not yaml by name", "/tree/shared": "b", // b.json is read after a.yaml
		}},
		{"*.y*ml", map[string]string{
			"/tree/a": "from a.yaml", "/tree/c": "from sub/c.yml",
			"/tree/d":      "in a directory whose name matches no filter, still searched",
			"/tree/shared": "a",
		}},
		{"*.json", map[string]string{"/tree/b": "from b.json", "/tree/shared": "b"}},
	} {
		t.Run("filter="+tc.filter, func(t *testing.T) {
			got := get(t, []string{"testdata/tree"}, tc.filter, "/tree")
			if !maps.Equal(got, tc.want) {
				diff(t, got, tc.want)
			}
		})
	}
}

func TestFilesInOrderLaterWins(t *testing.T) {
	// A file named directly is read whatever the filter says.
	got := get(t, []string{"testdata/tree", "testdata/tree/a.yaml"}, "*.json", "/tree/shared")
	if want := map[string]string{"/tree/shared": "a"}; !maps.Equal(got, want) {
		diff(t, got, want)
	}
}

func TestSymlinkedDirectory(t *testing.T) {
	abs, err := filepath.Abs("testdata/tree")
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(abs, link); err != nil {
		t.Skip("symlinks not available:", err)
	}
	got := get(t, []string{link}, "*.json", "/tree/b")
	if want := map[string]string{"/tree/b": "from b.json"}; !maps.Equal(got, want) {
		diff(t, got, want)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		paths []string
		want  []string // substrings of the error
	}{
		{"syntax error names file and line", []string{"testdata/bad/ok.yaml", "testdata/bad"}, []string{"testdata/bad/broken.yaml", "line 3"}},
		{"top level list", []string{"testdata/toplist.yaml"}, []string{"testdata/toplist.yaml:1:", "mapping"}},
		{"alias cycle", []string{"testdata/cycle.yaml"}, []string{"testdata/cycle.yaml:2:", "itself"}},
		{"missing file", []string{"testdata/nope.yaml"}, []string{"testdata/nope.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.paths, "")
			if err != nil {
				t.Fatal(err)
			}
			vals, _, err := c.GetValues(context.Background(), []string{"/"})
			if err == nil {
				t.Fatalf("no error, values %v", vals)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := New(nil, ""); err == nil {
		t.Error("New without paths succeeded")
	}
	if _, err := New([]string{"testdata"}, "[unclosed"); err == nil || !strings.Contains(err.Error(), "[unclosed") {
		t.Errorf("New with bad filter: err = %v", err)
	}
}

func TestCanceledContext(t *testing.T) {
	c, err := New([]string{"testdata/types.yaml"}, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := c.GetValues(ctx, []string{"/"}); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestWatchUnsupported(t *testing.T) {
	c, err := New([]string{"testdata/types.yaml"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := any(c).(interface {
		Revision(context.Context, string) (int64, error)
	}); ok {
		t.Error("the file backend offers Watch")
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[string]bool, len(a))
	for _, s := range a {
		seen[s] = true
	}
	for _, s := range b {
		if !seen[s] {
			return false
		}
	}
	return true
}

func diff(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("missing %s (want %q)", k, w)
		} else if g != w {
			t.Errorf("%s = %q, want %q", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s = %q", k, g)
		}
	}
}
