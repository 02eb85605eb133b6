package resource

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestResourceWait: a resource's wait = "MIN[:MAX]" is its own quiescence;
// without it the daemon's -wait applies; a bad one names file and key.
func TestResourceWait(t *testing.T) {
	dir := confDir(t, map[string]string{
		"a.toml": "[template]\nsrc = \"t\"\ndest = \"/tmp/a\"\nkeys = [\"/a\"]\nwait = \"1s:3s\"\n",
		"b.toml": "[template]\nsrc = \"t\"\ndest = \"/tmp/b\"\nkeys = [\"/b\"]\n",
		"c.toml": "[template]\nsrc = \"t\"\ndest = \"/tmp/c\"\nkeys = [\"/c\"]\nwait = \"3s:1s\"\n",
	}, map[string]string{"t": "x\n"})
	s, _ := testSettings(dir)
	a, err := Load(filepath.Join(dir, "conf.d", "a.toml"), s)
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := a.Quiescence(); !ok || w.Min != time.Second || w.Max != 3*time.Second {
		t.Errorf("a: wait %v, %v", w, ok)
	}
	b, err := Load(filepath.Join(dir, "conf.d", "b.toml"), s)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Quiescence(); ok {
		t.Error("b has a wait of its own")
	}
	c := filepath.Join(dir, "conf.d", "c.toml")
	if _, err := Load(c, s); err == nil || !strings.Contains(err.Error(), c) || !strings.Contains(err.Error(), "template.wait") {
		t.Errorf("c: err = %v", err)
	}
}
