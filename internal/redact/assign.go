package redact

import (
	"slices"
	"strings"
)

// credentialWords mark configuration keys whose values are credentials.
var credentialWords = []string{"password", "passwd", "token", "secret"}

// ParseMessage is a parser's message about line (1-based) of src, unless
// that line assigns a credential ("key = value", as in confd.toml, with a
// credential word in the key): then a message that names only the key,
// since parsers quote what they found ("expected value but found
// \"hunter\" instead").
func ParseMessage(src []byte, line int, msg string) string {
	lines := strings.Split(string(src), "\n")
	if line < 1 || line > len(lines) {
		return msg
	}
	k, _, found := strings.Cut(lines[line-1], "=")
	key := strings.ToLower(strings.Trim(strings.TrimSpace(k), `"'`))
	if found && slices.ContainsFunc(credentialWords, func(w string) bool { return strings.Contains(key, w) }) {
		return "the value of \"" + key + "\" does not parse as TOML (message not shown: it would quote the value); quote it as \"...\" or '...'"
	}
	return msg
}
