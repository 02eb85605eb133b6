package redact

import "strings"

// credentialWords mark configuration keys whose values are credentials.
var credentialWords = []string{"password", "passwd", "token", "secret"}

// CredentialKey reports whether a configuration line ("key = value", as in
// confd.toml) assigns a credential, and returns its key. A parser's error
// about such a line must not be shown, since parsers quote what they found
// ("expected value but found \"hunter\" instead").
func CredentialKey(line string) (key string, ok bool) {
	k, _, found := strings.Cut(line, "=")
	if !found {
		return "", false
	}
	key = strings.ToLower(strings.Trim(strings.TrimSpace(k), `"'`))
	for _, w := range credentialWords {
		if strings.Contains(key, w) {
			return key, true
		}
	}
	return "", false
}
