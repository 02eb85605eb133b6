package suggest

import "testing"

func TestClosest(t *testing.T) {
	keys := []string{"check_cmd", "reload_cmd", "onetime", "confdir", "config-file", "node", "noop", "watch", "interval"}
	for name, want := range map[string]string{
		"CheckCmd":    "check_cmd",
		"check-cmd":   "check_cmd",
		"onetim":      "onetime",
		"one-time":    "onetime",
		"confdr":      "confdir",
		"config_file": "config-file",
		"intervall":   "interval",
		"nod":         "node",
		"nope":        "node",
		"ab":          "",
		"x":           "",
		"frobnicate":  "",
	} {
		if got := Closest(name, keys); got != want {
			t.Errorf("Closest(%q) = %q, want %q", name, got, want)
		}
	}
}
