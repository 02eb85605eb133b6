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

// ParseMessage is a parser's message about line (1-based) of src, unless
// that line assigns a credential: then a message that names only the key.
func ParseMessage(src []byte, line int, msg string) string {
	lines := strings.Split(string(src), "\n")
	if line < 1 || line > len(lines) {
		return msg
	}
	if key, ok := CredentialKey(lines[line-1]); ok {
		return "the value of \"" + key + "\" does not parse as TOML (message not shown: it would quote the value); quote it as \"...\" or '...'"
	}
	return msg
}
