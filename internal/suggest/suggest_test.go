package suggest

import "testing"

func TestClosest(t *testing.T) {
	names := []string{"endpoints", "health-url", "health-cacert", "health-timeout", "ttl", "host", "timeout", "preflight-flags-file", "preflight-file"}
	for _, tc := range []struct{ in, want string }{
		{"endpoint", "endpoints"},
		{"healthurl", "health-url"},
		{"Health_URL", "health-url"},
		{"health-timout", "health-timeout"},
		{"preflight-flag-file", "preflight-flags-file"},
		{"preflight-files", "preflight-file"},
		{"tl", "ttl"},
		{"hots", ""}, // a transposition is two edits: too far for 4 letters
		{"timeot", "timeout"},
		{"health", ""}, // a prefix of three names: which one?
		{"frobnicate", ""},
		{"ttl", ""}, // itself is no suggestion
		{"", ""},
	} {
		if got := Closest(tc.in, names); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := Closest("endp", []string{"endpoints", "cacert"}); got != "endpoints" {
		t.Errorf("a unique prefix: got %q", got)
	}
}
