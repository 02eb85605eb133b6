// Package keypath holds the one rule every backend uses to decide whether a
// stored key belongs to a requested key: as a path, not as a string prefix.
package keypath

import "strings"

// Under reports whether key is prefix itself or lies below it as a path:
// "/foo" covers "/foo" and "/foo/x" but never "/foobar". A prefix ending in
// "/" (including "/" itself) covers every key that starts with it, and the
// empty prefix covers everything, as a plain prefix range would.
//
// confd matched with strings.HasPrefix in some backends, so a template asking
// for "/app" silently received "/app-staging/..." as well; that is the bug
// this rule exists to avoid.
func Under(key, prefix string) bool {
	if prefix == "" || strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(key, prefix)
	}
	return key == prefix || (strings.HasPrefix(key, prefix) && key[len(prefix)] == '/')
}

// UnderAny reports whether key is Under at least one of prefixes.
func UnderAny(key string, prefixes []string) bool {
	for _, p := range prefixes {
		if Under(key, p) {
			return true
		}
	}
	return false
}
