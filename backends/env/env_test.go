package env

import (
	"context"
	"errors"
	"maps"
	"testing"
)

func TestGetValues(t *testing.T) {
	environ := func() []string {
		return []string{
			"FOO=top",
			"FOO_BAR=1",
			"FOO_BAR_BAZ=2",
			"FOO_BARX=not under /foo/bar",
			"FOOD=not under /foo",
			"APP_DB_URL=postgres://h/db?x=y", // value keeps its own "="
			"lower_case=never matched by an upper-cased key",
			"EMPTY=",
			"=C:=C:\\windows", // no name
			"NOEQUALS",
		}
	}
	c := New(environ)
	for _, tc := range []struct {
		name string
		keys []string
		want map[string]string
	}{
		{"exact and below", []string{"/foo/bar"}, map[string]string{"/foo/bar": "1", "/foo/bar/baz": "2"}},
		{"no leading slash", []string{"foo/bar/baz"}, map[string]string{"/foo/bar/baz": "2"}},
		{"lower case key", []string{"/app/db"}, map[string]string{"/app/db/url": "postgres://h/db?x=y"}},
		{"not a string prefix", []string{"/foo"}, map[string]string{
			"/foo": "top", "/foo/bar": "1", "/foo/bar/baz": "2", "/foo/barx": "not under /foo/bar",
		}},
		{"several keys", []string{"/empty", "/foo/bar/baz"}, map[string]string{"/empty": "", "/foo/bar/baz": "2"}},
		{"trailing slash", []string{"/foo/"}, map[string]string{
			"/foo/bar": "1", "/foo/bar/baz": "2", "/foo/barx": "not under /foo/bar",
		}},
		{"root returns all", []string{"/"}, map[string]string{
			"/foo": "top", "/foo/bar": "1", "/foo/bar/baz": "2", "/foo/barx": "not under /foo/bar",
			"/food": "not under /foo", "/app/db/url": "postgres://h/db?x=y",
			"/lower/case": "never matched by an upper-cased key", "/empty": "",
		}},
		{"missing", []string{"/nope"}, map[string]string{}},
		{"no keys", nil, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rev, err := c.GetValues(context.Background(), tc.keys)
			if err != nil {
				t.Fatal(err)
			}
			if rev != 0 {
				t.Errorf("revision = %d, want 0", rev)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("GetValues(%q)\n got %v\nwant %v", tc.keys, got, tc.want)
			}
		})
	}
}

func TestDefaultsToProcessEnvironment(t *testing.T) {
	t.Setenv("KEYSYNC_ENVTEST_VALUE", "x")
	got, _, err := New(nil).GetValues(context.Background(), []string{"/keysync/envtest"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"/keysync/envtest/value": "x"}; !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := New(nil).GetValues(ctx, []string{"/"}); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestWatchUnsupported(t *testing.T) {
	c := New(nil)
	if _, ok := any(c).(interface {
		Revision(context.Context, string) (int64, error)
	}); ok {
		t.Error("the env backend offers a watch")
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
