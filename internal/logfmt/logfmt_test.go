package logfmt

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
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
		l, err := New(&b, "debug", tc.format, false)
		if err != nil {
			t.Fatal(err)
		}
		l.WithField("resource", "a.toml").Warn("hello")
		if !tc.want.MatchString(b.String()) {
			t.Errorf("format %q: %q", tc.format, b.String())
		}
	}
	for _, bad := range [][2]string{{"loud", ""}, {"info", "xml"}} {
		if _, err := New(&b0, bad[0], bad[1], false); err == nil || !strings.Contains(err.Error(), "-log-") {
			t.Errorf("New(%q, %q) error = %v", bad[0], bad[1], err)
		}
	}
}

var b0 bytes.Buffer

func TestRecordsAreRedacted(t *testing.T) {
	key := "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBgh6/4vBhHETAcq3TpoAoGCCqGSM49\n-----END EC PRIVATE KEY-----"
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		l, err := New(&b, "info", format, false)
		if err != nil {
			t.Fatal(err)
		}
		l.WithField("output", "+"+strings.ReplaceAll(key, "\n", "\n+")).Errorf("check failed: %s; node https://root:pw1234@h:2379", key)
		if strings.Contains(b.String(), "MHcCAQEEIBkg") || strings.Contains(b.String(), "pw1234") {
			t.Errorf("%s record leaks: %s", format, b.String())
		}
	}
}

// Through the real loggers: `base64 -w0` of a key file with 0, 1 and 2
// bytes before the key (every offset modulo 3) is masked in both formats,
// and the JSON record stays valid.
func TestLoggersMaskEncodedKeysAtEveryOffset(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(k)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	for _, format := range []string{"text", "json"} {
		for _, before := range []string{"", "\n", "#\n"} {
			enc := base64.StdEncoding.EncodeToString(append([]byte(before), keyPEM...))
			var b bytes.Buffer
			l, err := New(&b, "", format, false)
			if err != nil {
				t.Fatal(err)
			}
			l.Infof("reload_cmd output: %s", enc)
			if strings.Contains(b.String(), enc[20:60]) || !strings.Contains(b.String(), "[private key redacted]") {
				t.Errorf("%s, %d bytes before: %s", format, len(before), b.String())
			}
			if format == "json" && !json.Valid(bytes.TrimSpace(b.Bytes())) {
				t.Errorf("invalid JSON: %s", b.String())
			}
		}
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		`time="x" level=info msg="a b"`: `time="x" level=info msg="a b"`,
		"tab\there":                     `"tab\there"`,
		"esc \x1b[31m":                  `"esc \x1b[31m"`,
		"":                              `""`,
		"bad \xff":                      `"bad \xff"`,
		"ünïcode":                       "ünïcode",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %s, want %s", in, got, want)
		}
	}
}
