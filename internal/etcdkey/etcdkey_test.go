package etcdkey

import "testing"

func TestDirAndJoin(t *testing.T) {
	for prefix, want := range map[string]string{"/k": "/k/", "/k/": "/k/", "/k//": "/k/"} {
		if got := Dir(prefix); got != want {
			t.Errorf("Dir(%q) = %q, want %q", prefix, got, want)
		}
		if got := Join(prefix, "h1", "state"); got != want+"h1/state" {
			t.Errorf("Join(%q, h1, state) = %q, want %q", prefix, got, want+"h1/state")
		}
	}
}

func TestHost(t *testing.T) {
	for key, want := range map[string]string{
		"/k/h1.example": "h1.example", "/k/": "", "/k": "", "/k/a/b": "", "/k-trust/h1": "", "/other": "",
	} {
		for _, prefix := range []string{"/k", "/k/"} {
			if got := Host(prefix, key); got != want {
				t.Errorf("Host(%q, %q) = %q, want %q", prefix, key, got, want)
			}
		}
	}
}
