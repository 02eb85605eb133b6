// Package redact masks secrets (private key material, credentials in URLs)
// in text that is about to reach a log, an error or a terminal. Both
// binaries use it for every output path that can carry file contents or
// command output.
//
// A private key block is recognised by its armour markers wherever they sit
// in a line: after a diff marker ("+", "-", "> ", "< "), a log prefix, an
// indentation, or inside a JSON string whose newlines are escaped ("\n").
// Everything between a BEGIN marker and its END marker is masked, whether
// the two are on one line or many; a BEGIN without an END masks to the end
// of the text (or, for Lines, of the stream).
package redact

import (
	"regexp"
	"strings"
)

// Mask replaces private key material.
const Mask = "[private key redacted]"

// PasswordMask replaces the password of a URL's user information.
const PasswordMask = "xxxxx"

var (
	// beginRE matches the BEGIN armour of any private key PEM type: PKCS#1
	// ("RSA PRIVATE KEY"), SEC1 ("EC PRIVATE KEY"), PKCS#8 ("PRIVATE KEY",
	// "ENCRYPTED PRIVATE KEY"), OpenSSH, DSA, and OpenPGP ("PGP PRIVATE KEY
	// BLOCK"; some tools write "SECRET KEY").
	beginRE = regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*(?:PRIVATE|SECRET) KEY[A-Z ]*-----`)
	// endRE matches any END armour; inside a key block the first one closes it.
	endRE = regexp.MustCompile(`-----END [A-Z0-9 ]*-----`)
	// urlPassRE finds "scheme://user:password@" in URLs printed by clients.
	urlPassRE = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@"']*:)([^/\s@"']+)(@)`)
	// b64RunRE is a run of base64 text long enough to be key material.
	b64RunRE = regexp.MustCompile(`[A-Za-z0-9+/=]{16,}`)
)

// String masks every private key block in s, base64-encoded keys in any
// shape (see encoded.go), and passwords in URLs. The number of lines is
// kept, so a masked diff or log still lines up.
func String(s string) string {
	if strings.Contains(s, "://") {
		s = urlPassRE.ReplaceAllString(s, "${1}"+PasswordMask+"${3}")
	}
	return maskKeys(s)
}

// HasKey reports whether s holds private key material that String would
// mask, for inputs that must be refused rather than stored masked (a hold
// reason, a flag value).
func HasKey(s string) bool { return maskKeys(s) != s }

// maskKeys is String without the URL passwords.
func maskKeys(s string) string {
	armoured := strings.Contains(s, "KEY")
	if !armoured {
		// One line, as a log record is: no block to judge, and no
		// allocation unless something is masked.
		if body := strings.TrimSuffix(s, "\n"); !strings.Contains(body, "\n") {
			if m := maskRuns(body); m != body {
				return m + s[len(body):]
			}
			return s
		}
		if !hasRun(s, minRunLine) {
			return s
		}
	}
	lines := strings.Split(s, "\n")
	if armoured {
		var f Lines
		for i, l := range lines {
			if i < len(lines)-1 || l != "" { // "" after the last newline is no line
				lines[i] = f.armour(l)
			}
		}
		maskOrphanBodies(lines)
	}
	maskEncodedLines(lines)
	return strings.Join(lines, "\n")
}

// maskOrphanBodies masks key bodies whose BEGIN line is not in the text
// (output cut to its last lines): base64 lines directly above an END armour
// of a private key that no BEGIN opened.
func maskOrphanBodies(lines []string) {
	for i, l := range lines {
		if !strings.Contains(l, "-----END ") || strings.Contains(l, Mask) {
			continue
		}
		m := endRE.FindString(l)
		if !strings.Contains(m, "PRIVATE KEY") && !strings.Contains(m, "SECRET KEY") {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			if !looksLikeKeyBody(lines[j]) {
				break
			}
			lines[j] = Mask
		}
	}
}

// looksLikeKeyBody is true for a base64 line or a PEM header line
// ("Proc-Type: ...", "DEK-Info: ...") with any short prefix.
func looksLikeKeyBody(l string) bool {
	t := strings.TrimSpace(l)
	return b64RunRE.MatchString(t) && !strings.Contains(t, "-----") ||
		strings.Contains(t, "Proc-Type:") || strings.Contains(t, "DEK-Info:")
}

// armour masks what lies inside private key armour in one line of a
// stream, remembering whether the stream is inside a key block.
func (f *Lines) armour(l string) string {
	if !f.inKey && !strings.Contains(l, "-----") {
		return l
	}
	var b strings.Builder
	rest := l
	if f.inKey {
		loc := endRE.FindStringIndex(rest)
		if loc == nil {
			return f.keepPrefix(l) + Mask
		}
		before := rest[:loc[0]]
		if b64RunRE.MatchString(before) {
			b.WriteString(f.keepPrefix(before))
			b.WriteString(Mask)
		} else {
			b.WriteString(before)
		}
		b.WriteString(rest[loc[0]:loc[1]])
		rest = rest[loc[1]:]
		f.inKey = false
	}
	for {
		loc := beginRE.FindStringIndex(rest)
		if loc == nil {
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:loc[1]])
		if b.Len() == loc[1] && !f.inKey {
			f.prefix = rest[:loc[0]]
		} else {
			f.prefix = ""
		}
		rest = rest[loc[1]:]
		end := endRE.FindStringIndex(rest)
		if end == nil {
			// The block goes on past this line. Inside a JSON string (a
			// log record of the BEGIN line alone), the body ends at the
			// string's closing quote: what follows is the record's own.
			tail := ""
			if q := closingQuote(rest); q >= 0 {
				rest, tail = rest[:q], rest[q:]
			}
			if strings.TrimSpace(rest) != "" {
				b.WriteString(Mask)
			}
			b.WriteString(tail)
			f.inKey = true
			return b.String()
		}
		body := rest[:end[0]]
		b.WriteString(edgeBreak(body, strings.HasPrefix))
		b.WriteString(Mask)
		b.WriteString(edgeBreak(body, strings.HasSuffix))
		b.WriteString(rest[end[0]:end[1]])
		rest = rest[end[1]:]
	}
}

// closingQuote is the index of the first '"' in s that no backslash
// escapes, or -1.
func closingQuote(s string) int {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// edgeBreak returns the escaped line break (`\n`, `\r\n`, `\\n`) or blank
// at one edge of a key body written on one line, so the masked form keeps
// the shape of the original.
func edgeBreak(body string, at func(s, edge string) bool) string {
	for _, nl := range []string{`\\r\\n`, `\\n`, `\r\n`, `\n`, " "} {
		if at(body, nl) {
			return nl
		}
	}
	return ""
}

// keepPrefix returns the part of a body line that is the diff marker or
// indentation seen before the BEGIN armour, and nothing of the key itself.
func (f *Lines) keepPrefix(l string) string {
	n := len(f.prefix)
	if n == 0 || n > len(l) {
		return ""
	}
	for i := 0; i < n; i++ {
		p, c := f.prefix[i], l[i]
		switch {
		case p == c && strings.IndexByte("+-<>| \t", p) >= 0:
		case (p == '+' || p == '-') && (c == '+' || c == '-'):
		case (p == ' ' || p == '\t') && (c == ' ' || c == '\t'):
		default:
			return ""
		}
	}
	return l[:n]
}
