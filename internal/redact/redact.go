// Package redact masks secrets (private key material) in text that is about
// to reach a log, an error or a terminal. Both binaries use it for every
// output path that can carry file contents or command output.
package redact

import "strings"

// Mask replaces a private key body line.
const Mask = "[private key redacted]"

// String masks the body of every PEM private key block in s.
func String(s string) string {
	if !strings.Contains(s, "PRIVATE KEY") {
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	var f Lines
	for i, l := range lines {
		body, nl := strings.CutSuffix(l, "\n")
		lines[i] = f.Line(body)
		if nl {
			lines[i] += "\n"
		}
	}
	return strings.Join(lines, "")
}

// Lines masks private key blocks in a stream of lines, one call per line
// (without its newline), for output that is logged as it arrives. The zero
// value is ready to use; it remembers whether it is inside a key block.
type Lines struct {
	inKey bool
}

// Line returns l, or the mask when l belongs to a private key block.
func (f *Lines) Line(l string) string {
	t := strings.TrimSpace(l)
	switch {
	case strings.HasPrefix(t, "-----BEGIN ") && strings.HasSuffix(t, "PRIVATE KEY-----"):
		f.inKey = true
	case strings.HasPrefix(t, "-----END ") && f.inKey:
		f.inKey = false
	case f.inKey:
		return Mask
	}
	return l
}
