package redact

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	in := "a\n-----BEGIN RSA PRIVATE KEY-----\nSECRETBYTES\n-----END RSA PRIVATE KEY-----\n-----BEGIN PUBLIC KEY-----\nPUB\n-----END PUBLIC KEY-----\n"
	out := String(in)
	if strings.Contains(out, "SECRETBYTES") || !strings.Contains(out, "PUB") || !strings.Contains(out, Mask) {
		t.Fatalf("String = %q", out)
	}
	if strings.Count(out, "\n") != strings.Count(in, "\n") {
		t.Fatalf("String changed the line count: %q", out)
	}
}

func TestLinesStream(t *testing.T) {
	var f Lines
	got := []string{}
	for _, l := range []string{"x", "-----BEGIN EC PRIVATE KEY-----", "SECRET", "-----END EC PRIVATE KEY-----", "y"} {
		got = append(got, f.Line(l))
	}
	if strings.Contains(strings.Join(got, "\n"), "SECRET\n") || got[2] != Mask || got[4] != "y" {
		t.Fatalf("Lines = %q", got)
	}
}
