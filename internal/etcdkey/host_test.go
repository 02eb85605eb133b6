package etcdkey

import "testing"

func TestValidHost(t *testing.T) {
	for _, h := range []string{"m1", "m1.example.com", "master-1", "10.0.0.1"} {
		if err := ValidHost(h); err != nil {
			t.Errorf("%q: %v", h, err)
		}
	}
	for _, h := range []string{"", "a/../x", "a/b", "/m1", "..", ".", "a..b", "m1\nINFO forged", "m1\x00", "m1\t"} {
		if err := ValidHost(h); err == nil {
			t.Errorf("%q accepted", h)
		}
	}
}
