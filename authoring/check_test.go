package authoring

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/resource"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// knownKeys stands in for main's confd.toml key table.
func knownKeys(k string, v any) error {
	switch k {
	case "backend", "confdir", "watch":
		return nil
	case "interval":
		if _, ok := v.(int64); !ok {
			return errors.New(`key "interval": not a number`)
		}
		return nil
	}
	return errors.New("unknown key " + `"` + k + `"`)
}

func runCheck(t *testing.T, dir string, names ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := Check(context.Background(), CheckOptions{
		Config:    ConfigFile{Path: filepath.Join(dir, "confd.toml"), Set: knownKeys},
		Settings:  apply.Settings{Settings: resource.Settings{ConfDir: dir}},
		Resources: names,
		Out:       &out,
	})
	return code, out.String()
}

func TestCheckExampleConfdir(t *testing.T) {
	var out bytes.Buffer
	code := Check(context.Background(), CheckOptions{
		Settings: apply.Settings{Settings: resource.Settings{ConfDir: "../examples/confd"}},
		Out:      &out,
	})
	if code != 0 || !strings.Contains(out.String(), "OK: 2 resource(s), 2 template(s)") {
		t.Fatalf("Check(examples/confd) = %d:\n%s", code, out.String())
	}
}

const goodResource = "[template]\nsrc = \"ok.tmpl\"\ndest = \"/tmp/ok\"\nkeys = [\"/a\"]\n"

func TestCheckReportsEveryProblemWithFileAndLine(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"confd.toml":             "backend = \"etcdv3\"\n\nbogus = 1\ninterval = \"soon\"\n",
		"conf.d/a-syntax.toml":   "[template]\nsrc = \"ok.tmpl\"\ndest = \n",
		"conf.d/b-unknown.toml":  "[template]\nsrc = \"ok.tmpl\"\ndest = \"/tmp/b\"\nkeys = [\"/a\"]\nreload_comand = \"x\"\n",
		"conf.d/c-missing.toml":  "[template]\nsrc = \"absent.tmpl\"\ndest = \"/tmp/c\"\n",
		"conf.d/d-func.toml":     "[template]\nsrc = \"badfunc.tmpl\"\ndest = \"/tmp/d\"\n",
		"conf.d/e-mode.toml":     "[template]\nsrc = \"ok.tmpl\"\ndest = \"/tmp/e\"\n\nmode = \"0999\"\n",
		"conf.d/f-owner.toml":    "[template]\nsrc = \"ok.tmpl\"\ndest = \"/tmp/f\"\nowner = \"no-such-user-xyz\"\n",
		"conf.d/g-duration.toml": "[template]\nsrc = \"ok.tmpl\"\ndest = \"/tmp/g\"\ncheck_cmd = \"true\"\ncheck_cmd_timeout = \"ten seconds\"\n",
		"conf.d/h-good.toml":     goodResource,
		"templates/ok.tmpl":      "{{getv \"/a\"}}\n",
		"templates/badfunc.tmpl": "line 1\n{{getv \"/a\"}}\n{{ pemNormalise (getv \"/a\") }}\n",
	})
	code, out := runCheck(t, dir)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	want := []string{
		filepath.Join(dir, "confd.toml") + `:3: unknown key "bogus"`,
		filepath.Join(dir, "confd.toml") + `:4: key "interval": not a number`,
		filepath.Join(dir, "conf.d/a-syntax.toml") + ":3: ",
		filepath.Join(dir, "conf.d/b-unknown.toml") + `:5: `,
		filepath.Join(dir, "conf.d/c-missing.toml") + ":2: template.src",
		filepath.Join(dir, "templates/badfunc.tmpl") + `:3: function "pemNormalise" not defined`,
		filepath.Join(dir, "conf.d/e-mode.toml") + ":5: template.mode",
		filepath.Join(dir, "conf.d/f-owner.toml") + ":4: template.owner",
		filepath.Join(dir, "conf.d/g-duration.toml") + ":5: template.check_cmd_timeout",
		"9 problem(s) found",
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	if strings.Contains(out, "h-good") || strings.Contains(out, "ok.tmpl:") {
		t.Errorf("report blames a good file")
	}
	if t.Failed() {
		t.Logf("report:\n%s", out)
	}
	if !strings.Contains(out, "reload_comand") {
		t.Errorf("the unknown key is not named:\n%s", out)
	}

	// -resource limits the check to the files named.
	code, out = runCheck(t, dir, "h-good")
	if code == 0 || strings.Contains(out, "conf.d/") || !strings.Contains(out, "confd.toml") {
		t.Errorf("Check -resource h-good = %d:\n%s\nwant only confd.toml's problems", code, out)
	}
	os.Remove(filepath.Join(dir, "confd.toml"))
	if code, out = runCheck(t, dir, "h-good.toml"); code != 0 {
		t.Errorf("Check -resource h-good.toml without confd.toml = %d:\n%s", code, out)
	}
}

func TestCheckConfigFileSyntaxAndAbsence(t *testing.T) {
	dir := writeTree(t, map[string]string{"confd.toml": "backend = \"etcdv3\"\nnodes = [\"a\"\n", "conf.d/.keep": ""})
	code, out := runCheck(t, dir)
	if code != 1 || !strings.Contains(out, filepath.Join(dir, "confd.toml")+":2: ") {
		t.Errorf("syntax error: exit %d:\n%s", code, out)
	}
	var buf bytes.Buffer
	missing := filepath.Join(dir, "absent.toml")
	code = Check(context.Background(), CheckOptions{Config: ConfigFile{Path: missing, Required: true}, Settings: apply.Settings{Settings: resource.Settings{ConfDir: dir}}, Out: &buf})
	if code != 1 || !strings.Contains(buf.String(), missing) {
		t.Errorf("required but absent confd.toml: exit %d:\n%s", code, buf.String())
	}
}
