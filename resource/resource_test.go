package resource

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// confDir lays out confdir/conf.d and confdir/templates with the given files.
func confDir(t testing.TB, resources, templates map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for sub, files := range map[string]map[string]string{"conf.d": resources, "templates": templates} {
		for name, body := range files {
			p := filepath.Join(dir, sub, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func testSettings(dir string) (*Settings, *test.Hook) {
	l, hook := test.NewNullLogger()
	l.SetLevel(logrus.DebugLevel)
	return &Settings{ConfDir: dir, Log: l}, hook
}

func TestLoadErrorsNameFileAndLine(t *testing.T) {
	tests := []struct {
		name, toml string
		want       []string
	}{
		{"syntax", "[template]\nsrc = \"a.tmpl\"\ndest = \n", []string{"bad.toml:3"}},
		{"no table", "src = \"a.tmpl\"\n", []string{"bad.toml", "no [template] table"}},
		{"no dest", "[template]\nsrc = \"a.tmpl\"\n", []string{"bad.toml", "dest is empty"}},
		{"no src", "[template]\ndest = \"/tmp/x\"\n", []string{"bad.toml", "src is empty"}},
		{"missing template", "[template]\nsrc = \"missing.tmpl\"\ndest = \"/tmp/x\"\n", []string{"bad.toml", "missing.tmpl", "no such file"}},
		{"bad mode", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\nmode = \"0985\"\n", []string{"bad.toml", "template.mode", "0985"}},
		{"bad timeout", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\ncheck_cmd_timeout = \"soon\"\n", []string{"bad.toml", "check_cmd_timeout"}},
		{"bad check_cmd", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\ncheck_cmd = \"x {{.src\"\n", []string{"bad.toml", "check_cmd"}},
		{"unknown owner", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\nowner = \"no-such-user-xyz\"\n", []string{"bad.toml", "template.owner"}},
		{"unknown key", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\ncolour = \"blue\"\n", []string{"bad.toml:4: ", `unknown key "template.colour"`, "skipped"}},
		{"misspelt check_cmd", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\n\n  checkcmd = \"false\"\n", []string{"bad.toml:5: ", `"template.checkcmd"`, `did you mean "check_cmd"`}},
		{"check_cmd above [template]", "# resource\ncheck_cmd = \"false\"\n[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\n", []string{"bad.toml:2: ", `unknown key "check_cmd"`, "[template]"}},
		{"wait above [template]", "wait = \"1s\"\n[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\n", []string{"bad.toml:1: ", `unknown key "wait"`, "[template]"}},
		{"unknown table", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\n[ template.extra ]\nx = 1\n", []string{"bad.toml:4: ", `"template.extra"`}},
		{"owner vs uid", "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/x\"\nowner = \"root\"\nuid = 12\n", []string{"bad.toml", "uid is 12"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := confDir(t, map[string]string{"bad.toml": tc.toml}, map[string]string{"a.tmpl": "x"})
			s, _ := testSettings(dir)
			_, err := Load(filepath.Join(dir, "conf.d", "bad.toml"), s)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadFields(t *testing.T) {
	dir := confDir(t, map[string]string{"a.toml": `
[template]
src = "a.tmpl"
dest = "/tmp/a"
keys = ["/db", "user"]
prefix = "app"
mode = "640"
uid = 12
gid = 34
check_cmd = "check {{.src}}"
reload_cmd = "reload {{.dest}}"
reload_cmd_timeout = "90s"
`}, map[string]string{"a.tmpl": "x"})
	s, hook := testSettings(dir)
	s.CheckTimeout = 7 * time.Second
	r, err := Load(filepath.Join(dir, "conf.d", "a.toml"), s)
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != 0o640 {
		t.Errorf("mode = %#o, want 0640 (octal, not confd 0.16's decimal)", r.Mode)
	}
	if r.UID != 12 || r.GID != 34 {
		t.Errorf("uid:gid = %d:%d", r.UID, r.GID)
	}
	if got := strings.Join(r.StoreKeys(), ","); got != "/app/db,/app/user" {
		t.Errorf("store keys = %s", got)
	}
	if r.CheckTimeout != 7*time.Second || r.ReloadTimeout != 90*time.Second {
		t.Errorf("timeouts = %s, %s", r.CheckTimeout, r.ReloadTimeout)
	}
	if r.Src != filepath.Join(dir, "templates", "a.tmpl") {
		t.Errorf("src = %s", r.Src)
	}
	var warnedMode bool
	for _, e := range hook.AllEntries() {
		warnedMode = warnedMode || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, `mode "640" read as octal`))
	}
	if !warnedMode {
		t.Errorf("no warning about mode 640")
	}

	// A global -prefix replaces the resource's own, as in confd 0.16.
	s.Prefix = "/global"
	r, err = Load(filepath.Join(dir, "conf.d", "a.toml"), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.StoreKeys(), ","); got != "/global/db,/global/user" {
		t.Errorf("store keys with -prefix = %s", got)
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in   string
		want os.FileMode
		bad  bool
	}{
		{"", 0, false},
		{"0644", 0o644, false},
		{"644", 0o644, false},
		{"0o600", 0o600, false},
		{"4755", 0o755 | os.ModeSetuid, false},
		{"1777", 0o777 | os.ModeSticky, false},
		{"2750", 0o750 | os.ModeSetgid, false},
		{"rw-r--r--", 0, true},
		{"0800", 0, true},
		{"17777", 0, true},
	}
	for _, tc := range tests {
		got, err := parseMode(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseMode(%q) = %v, %v; want %v, bad=%v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestLoadAllKeepsGoodResources(t *testing.T) {
	dir := confDir(t, map[string]string{
		"good.toml":       "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/a\"\n",
		"sub/nested.toml": "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/b\"\n",
		"broken.toml":     "[template\n",
		"unchecked.toml":  "[template]\nsrc = \"a.tmpl\"\ndest = \"/tmp/c\"\ncheckcmd = \"false\"\n",
		"README":          "not a resource",
	}, map[string]string{"a.tmpl": "x"})
	s, _ := testSettings(dir)
	rs, errs := LoadNamed(s, nil)
	if len(rs) != 2 {
		t.Errorf("loaded %d resources, want 2", len(rs))
	}
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "broken.toml:2") || !strings.Contains(errs[1].Error(), "unchecked.toml:4") {
		t.Errorf("errors = %v, want broken.toml and unchecked.toml with their lines", errs)
	}
}
