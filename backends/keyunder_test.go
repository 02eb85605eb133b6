package backends

import "testing"

func TestKeyUnder(t *testing.T) {
	for _, tc := range []struct {
		key, prefix string
		want        bool
	}{
		{"/foo", "/foo", true},
		{"/foo/bar", "/foo", true},
		{"/foo/bar/baz", "/foo", true},
		{"/foobar", "/foo", false},
		{"/foobar/x", "/foo", false},
		{"/fo", "/foo", false},
		{"/", "/foo", false},
		{"/foo/", "/foo", true},
		{"/foo/bar", "/foo/", true},
		{"/foo", "/foo/", false},
		{"/foobar", "/foo/", false},
		{"/anything", "/", true},
		{"/", "/", true},
		{"noslash", "/", false},
		{"noslash", "", true},
		{"/a/b", "/a/b", true},
		{"/a/bc", "/a/b", false},
	} {
		if got := KeyUnder(tc.key, tc.prefix); got != tc.want {
			t.Errorf("KeyUnder(%q, %q) = %v, want %v", tc.key, tc.prefix, got, tc.want)
		}
	}
}

func TestKeyUnderAny(t *testing.T) {
	prefixes := []string{"/a", "/b/c"}
	for key, want := range map[string]bool{
		"/a": true, "/a/x": true, "/ab": false, "/b": false, "/b/c/d": true, "/b/cd": false,
	} {
		if got := KeyUnderAny(key, prefixes); got != want {
			t.Errorf("KeyUnderAny(%q) = %v, want %v", key, got, want)
		}
	}
	if KeyUnderAny("/a", nil) {
		t.Error("UnderAny with no prefixes matched")
	}
}
