package waitspec

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]Spec{
		"":        {},
		"0":       {},
		"2s:10s":  {2 * time.Second, 10 * time.Second},
		"500ms":   {500 * time.Millisecond, 2 * time.Second},
		" 1s:1s ": {time.Second, time.Second},
		"0s:5s":   {0, 5 * time.Second},
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"2":       "MIN",
		"2s:x":    "MAX",
		"10s:2s":  "shorter",
		"-1s":     "negative",
		"1s:2s:3": "MAX",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), in) {
			t.Errorf("Parse(%q) err = %v, want mention of %q and the value", in, err, msg)
		}
	}
}
