package template

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	texttemplate "text/template"

	"github.com/kelseyhightower/memkv"

	kvstore "github.com/keysync/confd/store"
)

// gets hands a template the store's own pairs, not a copy, unless the
// template calls sortKVByLength, the one function that writes to a list
// of pairs (writesPairs): a sort must not reorder the store under later lookups, and
// what reverse does to gets's list (nothing: it is memkv.KVPairs) must
// stay as in confd.
func TestGetsSharesPairsOnlyWhereNothingWritesThem(t *testing.T) {
	// Key order /x/a /x/bbb /x/cc; length order /x/a /x/cc /x/bbb.
	kvs := map[string]string{"/x/a": "1", "/x/bbb": "2", "/x/cc": "3"}
	for _, tc := range []struct{ name, src, want string }{
		{"a sorted list leaves the store in key order",
			`{{$a := gets "/x/*"}}{{$_ := sortKVByLength $a}}{{range $a}}{{.Key}} {{end}}| {{range gets "/x/*"}}{{.Key}} {{end}}`,
			"/x/a /x/cc /x/bbb | /x/a /x/bbb /x/cc "},
		{"reverse leaves gets's list as it is",
			`{{$a := gets "/x/*"}}{{$_ := reverse $a}}{{range $a}}{{.Key}} {{end}}| {{range gets "/x/*"}}{{.Key}} {{end}}`,
			"/x/a /x/bbb /x/cc | /x/a /x/bbb /x/cc "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := renderString(t, tc.src, kvs)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rendered %q, want %q", got, tc.want)
			}
		})
	}

	ix := kvstore.New(kvs)
	for src, shared := range map[string]bool{
		`{{range gets "/x/*"}}{{.Key}}{{end}}`:                                                    true,
		`{{range sortKVByLength (gets "/x/*")}}{{.Key}}{{end}}`:                                   false,
		`{{define "s"}}{{sortKVByLength .}}{{end}}{{range gets "/x/*"}}{{.Key}}{{end}}`:           false,
		`{{if 1}}{{else}}{{with 1}}{{template "t" (sortKVByLength (gets "/x/*"))}}{{end}}{{end}}`: false,
		// Named in a comment or a string, it is never called.
		`{{/* sortKVByLength */}}{{range gets "/x/*"}}{{.Key}}{{"sortKVByLength"}}{{end}}`: true,
	} {
		tmpl, err := texttemplate.New("t").Funcs(funcMap(&binding{})).Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		gets := funcMap(&binding{store: ix, readOnlyGets: sharesGets(tmpl)})["gets"].(func(string) (memkv.KVPairs, error))
		a, _ := gets("/x/*")
		b, _ := gets("/x/*")
		if got := &a[0] == &b[0]; got != shared {
			t.Errorf("template %s: gets shares the store's pairs: %v, want %v", src, got, shared)
		}
	}
}

// A render of range gets "/*" over many keys holds them once: the
// parse's gets shares the index's run (RenderIndex passes the parse's
// readOnlyGets on), where a copy would allocate 32 bytes a pair.
func TestRenderRangeOverGetsCopiesNoPairs(t *testing.T) {
	const n = 20_000
	kvs := make(map[string]string, n)
	for i := range n {
		kvs[fmt.Sprintf("/k%05d", i)] = ""
	}
	ix := kvstore.New(kvs)
	src := filepath.Join(t.TempDir(), "flat.tmpl")
	if err := os.WriteFile(src, []byte(`{{range gets "/*"}}{{end}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var r Renderer
	render := func() {
		txt, err := r.RenderIndex(src, ix, Options{})
		if err != nil {
			t.Fatal(err)
		}
		txt.Release()
	}
	render() // parsed once, and kept
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	render()
	runtime.ReadMemStats(&after)
	if got, copied := after.TotalAlloc-before.TotalAlloc, uint64(n*32); got >= copied {
		t.Errorf("a render allocated %d bytes; a copy of the pairs alone is %d", got, copied)
	}
}
