package template

import (
	"errors"
	"sort"
	"strings"

	kvstore "github.com/keysync/confd/store"
)

// minSecretLen is the shortest value that withoutValues looks for: shorter
// ones ("1", "on") would mask line numbers and words, and reveal little.
const minSecretLen = 6

// withoutValues is the last guard that keeps key values out of a render
// error. The functions' own errors already leave values out; this catches
// any message (of text/template, or of a function added later) that quotes
// a value or one of its lines anyway, and replaces it by the key's name.
func withoutValues(err error, store *kvstore.Index, decrypted []string) error {
	msg := err.Error()
	type secret struct{ text, name string }
	var secrets []secret
	add := func(v, name string) {
		for _, piece := range append([]string{v}, strings.Split(v, "\n")...) {
			if p := strings.TrimSpace(piece); len(p) >= minSecretLen && strings.Contains(msg, p) {
				secrets = append(secrets, secret{p, name})
			}
		}
	}
	store.Pairs(func(k, v string) { add(v, "[value of "+k+"]") })
	for _, v := range decrypted {
		add(v, "[decrypted value]")
	}
	if len(secrets) == 0 {
		return err
	}
	// Longest first, so a whole value is replaced before its lines.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i].text) > len(secrets[j].text) })
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s.text, s.name)
	}
	// The cause is dropped on purpose: unwrapping it would give the value back.
	return errors.New(msg)
}
