package template

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kelseyhightower/memkv"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

const (
	pemCP1 = "-----BEGIN PUBLIC KEY-----\n" +
		"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAcp1cp1cp1cp1cp1cp1cp\n" +
		"-----END PUBLIC KEY-----"
	pemCP2 = "-----BEGIN PUBLIC KEY-----\n" +
		"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAcp2cp2cp2cp2cp2cp2cp\n" +
		"-----END PUBLIC KEY-----\n" // stored with its trailing newline, as `etcdctl put k < file` does
	pemCP10 = "-----BEGIN PUBLIC KEY-----\n" +
		"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAcp10cp10cp10cp10cp10\n" +
		"-----END PUBLIC KEY-----"
)

// saKVs are service-account keys of three hosts; cp-10 sorts between cp-1
// and cp-2 because gets orders keys as strings.
var saKVs = map[string]string{
	"/sa/cp-1":             pemCP1,
	"/sa/cp-2":             pemCP2,
	"/sa/cp-10":            pemCP10,
	"/sa/cp-1/fingerprint": "not matched by /sa/*",
}

func withKVs(maps ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

var goldenCases = []struct {
	name string
	kvs  map[string]string
}{
	{name: "pem-bundle", kvs: saKVs},
	{name: "kube-apiserver", kvs: withKVs(saKVs, map[string]string{
		"/k8s/apiserver/advertise_address":                     "10.0.0.11",
		"/k8s/etcd/cp-1":                                       "https://10.0.0.11:2379",
		"/k8s/etcd/cp-2":                                       "https://10.0.0.12:2379",
		"/k8s/etcd/cp-10":                                      "https://10.0.0.10:2379",
		"/k8s/apiserver/flags/authorization_mode":              "Node,RBAC",
		"/k8s/apiserver/flags/allow_privileged":                "true",
		"/k8s/apiserver/flags/profiling":                       "false",
		"/k8s/feature_gates/SidecarContainers/enabled":         "true",
		"/k8s/feature_gates/InPlacePodVerticalScaling/enabled": "false",
		"/k8s/apiserver/audit/enabled":                         "1",
		"/k8s/apiserver/audit/days":                            "15",
		"/k8s/masters/cp-1":                                    "10.0.0.11",
		"/k8s/masters/cp-2":                                    "10.0.0.12",
		"/k8s/masters/cp-10":                                   "10.0.0.10",
	})},
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join("testdata", tc.name+".tmpl")
			golden := filepath.Join("testdata", tc.name+".golden")
			got, err := Render(src, tc.kvs)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("output differs from %s\ngot:\n%s\nwant:\n%s", golden, got, want)
			}
		})
	}
}

func TestMissingKeyError(t *testing.T) {
	out, path, err := renderString(t, "a: {{getv \"/app/port\"}}\n\nb: {{getv \"/missing\"}}\n", nestedKVs)
	if err == nil {
		t.Fatal("no error")
	}
	want := fmt.Sprintf(`execute template %s: template: test.conf.tmpl:3:5: executing "test.conf.tmpl" at <getv "/missing">: error calling getv: key does not exist: /missing`, path)
	if err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
	var ke *memkv.KeyError
	if !errors.As(err, &ke) || ke.Key != "/missing" {
		t.Errorf("errors.As(*memkv.KeyError) = %v, %+v; want key /missing", errors.As(err, &ke), ke)
	}
	if out != "" {
		t.Errorf("partial output %q, want none", out)
	}
}

func TestParseError(t *testing.T) {
	_, path, err := renderString(t, "ok\n{{nope \"/x\"}}\n", nil)
	want := fmt.Sprintf(`parse template %s: template: test.conf.tmpl:2: function "nope" not defined`, path)
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant  %s", err, want)
	}

	_, path, err = renderString(t, "a\nb\n{{if true}}", nil)
	want = fmt.Sprintf(`parse template %s: template: test.conf.tmpl:3: unexpected EOF`, path)
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant  %s", err, want)
	}
}

func TestUnreadableTemplate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.tmpl")
	out, err := Render(missing, nil)
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("err = %v, want fs.ErrNotExist naming %s", err, missing)
	}
	if out != nil {
		t.Errorf("output %q, want nil", out)
	}

	dir := t.TempDir()
	if _, err := Render(dir, nil); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("directory as template: err = %v, want one naming %s", err, dir)
	}
}

// confd renders an empty template to an empty file, not an error.
func TestEmptyTemplate(t *testing.T) {
	out, _, err := renderString(t, "", nil)
	if err != nil || out != "" {
		t.Errorf("got %q, %v; want empty output, no error", out, err)
	}
}

// Each render gets its own store, so concurrent renders never see each
// other's keys.
func TestConcurrentRendersAreIsolated(t *testing.T) {
	p := filepath.Join(t.TempDir(), "k.tmpl")
	if err := os.WriteFile(p, []byte(`{{getv "/k" "unset"}}{{range ls "/"}},{{.}}{{end}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kvs := map[string]string{"/k": fmt.Sprint(i), fmt.Sprintf("/only%d", i): "x"}
			if i%2 == 1 {
				kvs = map[string]string{}
			}
			got, err := Render(p, kvs)
			want := fmt.Sprintf("%d,k,only%d", i, i)
			if i%2 == 1 {
				want = "unset"
			}
			if err != nil || string(got) != want {
				t.Errorf("render %d = %q, %v; want %q", i, got, err, want)
			}
		}()
	}
	wg.Wait()
}

// TestRenderOutputAcrossChunks renders outputs around and far beyond the
// output's chunk sizes and compares them with the bytes expected.
func TestRenderOutputAcrossChunks(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "t.tmpl")
	if err := os.WriteFile(src, []byte(`{{range gets "/*"}}{{.Key}}={{.Value}}`+"\n"+`{{end}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 20, 21, 700, 3000, 20000} {
		kvs := map[string]string{}
		var want strings.Builder
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("/k%06d", i)
			v := strings.Repeat(string(rune('a'+i%26)), i%40)
			kvs[k] = v
			fmt.Fprintf(&want, "%s=%s\n", k, v)
		}
		got, err := Render(src, kvs)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want.String() {
			t.Fatalf("%d keys: %d bytes rendered, want %d (first difference at %d)", n, len(got), want.Len(), firstDiff(got, want.String()))
		}
	}
}

func firstDiff(a []byte, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
