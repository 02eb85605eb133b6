// Package etcdkey builds and reads the etcd keys of per-host values, one
// key per host under a prefix (PREFIX/HOST): published keys, trust
// records, rotation state. Every tool that reads or writes them goes
// through it, so that they agree on the keys whatever slashes the
// prefix was given with.
package etcdkey

import "strings"

// Dir returns prefix with exactly one trailing slash: what a prefix read
// asks for, so that "/a/keys" does not also match "/a/keys-trust/…".
func Dir(prefix string) string { return strings.TrimRight(prefix, "/") + "/" }

// Join returns the key PREFIX/ELEM/ELEM…, for example a host's record.
func Join(prefix string, elem ...string) string {
	return Dir(prefix) + strings.Join(elem, "/")
}

// Host returns the host whose value key is under prefix: "" for a key
// outside it, the prefix itself, or a key deeper than one level (not a
// host's value: the bundle template's PREFIX/* does not read it either).
func Host(prefix, key string) string {
	h, ok := strings.CutPrefix(key, Dir(prefix))
	if !ok || strings.Contains(h, "/") {
		return ""
	}
	return h
}
