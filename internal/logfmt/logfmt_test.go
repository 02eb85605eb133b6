package logfmt

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestFormats(t *testing.T) {
	tests := []struct {
		format string
		want   *regexp.Regexp
	}{
		{"", regexp.MustCompile(`^\d{4}-\d\d-\d\dT\S+ \S+ \S+\[\d+\]: WARNING hello resource=a\.toml\n$`)},
		{"json", regexp.MustCompile(`^\{.*"level":"warning".*"msg":"hello".*\}\n$`)},
	}
	for _, tc := range tests {
		var b bytes.Buffer
		l, err := New(&b, "debug", tc.format)
		if err != nil {
			t.Fatal(err)
		}
		l.WithField("resource", "a.toml").Warn("hello")
		if !tc.want.MatchString(b.String()) {
			t.Errorf("format %q: %q", tc.format, b.String())
		}
	}
	for _, bad := range [][2]string{{"loud", ""}, {"info", "xml"}} {
		if _, err := New(&b0, bad[0], bad[1]); err == nil || !strings.Contains(err.Error(), "-log-") {
			t.Errorf("New(%q, %q) error = %v", bad[0], bad[1], err)
		}
	}
}

var b0 bytes.Buffer

func TestRecordsAreRedacted(t *testing.T) {
	key := "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBgh6/4vBhHETAcq3TpoAoGCCqGSM49\n-----END EC PRIVATE KEY-----"
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		l, err := New(&b, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		l.WithField("output", "+"+strings.ReplaceAll(key, "\n", "\n+")).Errorf("check failed: %s; node https://root:pw1234@h:2379", key)
		if strings.Contains(b.String(), "MHcCAQEEIBkg") || strings.Contains(b.String(), "pw1234") {
			t.Errorf("%s record leaks: %s", format, b.String())
		}
	}
}
