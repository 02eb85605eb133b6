package preflight

import (
	"errors"
	"strings"
)

var errUnterminated = errors.New("unterminated quote")

// splitWords splits s the way a POSIX shell splits a command line, minus
// expansion: blanks separate words, '…' is literal, "…" honours \" \\ \$ \`,
// a backslash escapes the next byte, backslash-newline joins lines, and an
// unquoted # at the start of a word begins a comment. That covers systemd
// EnvironmentFile values and ExecStart lines as people write them. $VAR is
// kept literally: we cannot know its value, and it never names a flag.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\r':
			flush()
		case '#':
			if !inWord {
				// A comment runs to the end of its line, not of s.
				nl := strings.IndexByte(s[i:], '\n')
				if nl < 0 {
					return words, nil
				}
				i += nl
				continue
			}
			cur.WriteByte(c)
		case '\\':
			inWord = true
			if i+1 < len(s) {
				i++
				if s[i] != '\n' {
					cur.WriteByte(s[i])
				}
			}
		case '\'':
			inWord = true
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errUnterminated
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
		case '"':
			inWord = true
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`\n", s[i+1]) >= 0 {
					i++
					if s[i] == '\n' {
						continue
					}
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errUnterminated
			}
		default:
			inWord = true
			cur.WriteByte(c)
		}
	}
	flush()
	return words, nil
}
