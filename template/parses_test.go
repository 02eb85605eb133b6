package template

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kvstore "github.com/keysync/confd/store"
)

// kept is the parse of path that r holds, or nil.
func (r *Renderer) kept(path string) *parsed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idle[path]
}

// TestRenderParsesOncePerContent: renders of an unchanged template use one
// parse, each over its own keys; an edit, even of the same length, is
// parsed before the next render, as confd 0.16 reads the file every time.
func TestRenderParsesOncePerContent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.tmpl")
	if err := os.WriteFile(p, []byte(`a={{getv "/k"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var r Renderer
	render := func(v, want string) {
		t.Helper()
		got, err := r.Render(p, map[string]string{"/k": v})
		if err != nil || string(got) != want {
			t.Fatalf("render = %q, %v; want %q", got, err, want)
		}
	}
	render("1", "a=1")
	first := r.kept(p)
	if first == nil {
		t.Fatal("no parse kept after a render")
	}
	render("2", "a=2")
	if r.kept(p) != first {
		t.Error("an unchanged template was parsed again")
	}
	if first.b.store != nil || first.b.seen != nil {
		t.Error("the kept parse still holds the last render's keys")
	}
	if err := os.WriteFile(p, []byte(`b={{getv "/k"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	render("3", "b=3")
	if r.kept(p) == first {
		t.Error("an edited template was not parsed again")
	}
}

// TestKeptParseForgetsTheKeyring: a render without -secret-keyring must not
// decrypt with the keyring of an earlier render of the same template.
func TestKeptParseForgetsTheKeyring(t *testing.T) {
	ring, e := testKeyring(t, nil)
	kr, err := ReadKeyring(ring)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "c.tmpl")
	if err := os.WriteFile(p, []byte(`{{cgetv "/s"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	kvs := map[string]string{"/s": secconfEncode(t, e, "s3cret")}
	var r Renderer
	if got, err := r.Render(p, kvs, Options{Keyring: kr}); err != nil || string(got) != "s3cret" {
		t.Fatalf("with keyring: %q, %v", got, err)
	}
	if got, err := r.Render(p, kvs); err == nil || !strings.Contains(err.Error(), "needs -secret-keyring") {
		t.Fatalf("without keyring after a render with one: %q, %v; want the -secret-keyring error", got, err)
	}
}

// TestKeptParsesAreBounded: a daemon with thousands of templates keeps at
// most maxKeptParses parses.
func TestKeptParsesAreBounded(t *testing.T) {
	dir := t.TempDir()
	var r Renderer
	for i := range maxKeptParses + 10 {
		p := filepath.Join(dir, fmt.Sprintf("%d.tmpl", i))
		if err := os.WriteFile(p, []byte(`x`), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Render(p, nil); err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	n := len(r.idle)
	r.mu.Unlock()
	if n > maxKeptParses {
		t.Errorf("%d parses kept; at most %d", n, maxKeptParses)
	}
}

// TestFuncMapReadsItsStore: FuncMap's key functions read the store it was
// given (CheckFile and the authoring tools use it).
func TestFuncMapReadsItsStore(t *testing.T) {
	m := FuncMap(kvstore.New(map[string]string{"/a": "1"}))
	getv := m["getv"].(func(string, ...string) (string, error))
	if v, err := getv("/a"); err != nil || v != "1" {
		t.Errorf("getv /a = %q, %v", v, err)
	}
}
