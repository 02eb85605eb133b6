package keypath

import "testing"

func TestUnder(t *testing.T) {
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
		if got := Under(tc.key, tc.prefix); got != tc.want {
			t.Errorf("Under(%q, %q) = %v, want %v", tc.key, tc.prefix, got, tc.want)
		}
	}
}

func TestUnderAny(t *testing.T) {
	prefixes := []string{"/a", "/b/c"}
	for key, want := range map[string]bool{
		"/a": true, "/a/x": true, "/ab": false, "/b": false, "/b/c/d": true, "/b/cd": false,
	} {
		if got := UnderAny(key, prefixes); got != want {
			t.Errorf("UnderAny(%q) = %v, want %v", key, got, want)
		}
	}
	if UnderAny("/a", nil) {
		t.Error("UnderAny with no prefixes matched")
	}
}
