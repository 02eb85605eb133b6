package groupguard

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestHandoverEncoding(t *testing.T) {
	for _, env := range [][]string{nil, {"A=1"}, {"A=1", "B=", "C=x=y z"}} {
		got, err := readHandover(bytes.NewReader(EncodeHandover(env)))
		if err != nil || strings.Join(got, "\n") != strings.Join(env, "\n") || len(got) != len(env) {
			t.Fatalf("%q: got %q, %v", env, got, err)
		}
	}
	if _, err := readHandover(bytes.NewReader(nil)); !errors.Is(err, errNoHandover) {
		t.Fatalf("EOF at once: %v, want errNoHandover", err)
	}
	// Cut anywhere short of its end, a hand-over is refused.
	full := EncodeHandover([]string{"A=1", "B=2"})
	for n := 1; n < len(full); n++ {
		if env, err := readHandover(bytes.NewReader(full[:n])); err == nil {
			t.Fatalf("cut at %d of %d: accepted %q", n, len(full), env)
		}
	}
}
