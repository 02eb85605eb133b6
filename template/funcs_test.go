package template

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nestedKVs mixes leaves and directories at several depths, including a key
// that is also a directory (/app/upstream/c) and top-level leaves, so the
// ls/lsdir quirks show.
var nestedKVs = map[string]string{
	"/top":                  "root",
	"/empty":                "",
	"/app/db/user":          "admin",
	"/app/db/pass":          "s3cret",
	"/app/port":             "8080",
	"/app/upstream/a":       "10.0.0.3:80",
	"/app/upstream/b":       "10.0.0.2:80",
	"/app/upstream/c":       "10.0.0.1:80",
	"/app/upstream/c/extra": "x",
	"/len/a1":               "two",
	"/len/b":                "one",
	"/len/c22":              "three",
	"/json/obj":             `{"name":"es","tags":["a","b"],"n":1.5,"big":100000000,"nested":{"k":true}}`,
	"/json/arr":             `["1", 2, true, null]`,
}

// renderString renders src as a template file named like confd's tests name
// theirs, so error texts in expectations are stable.
func renderString(t *testing.T, src string, kvs map[string]string) (string, string, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "test.conf.tmpl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := Render(p, kvs)
	return string(out), p, err
}

type funcCase struct {
	name    string
	tmpl    string
	want    string
	wantErr string // substring of the error; empty means success
}

func runFuncCases(t *testing.T, kvs map[string]string, cases []funcCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := renderString(t, tc.tmpl, kvs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q (output %q)", err, tc.wantErr, got)
				}
				if got != "" {
					t.Errorf("output on error = %q, want none", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestMemkvFuncs(t *testing.T) {
	runFuncCases(t, nestedKVs, []funcCase{
		{name: "get", tmpl: `{{with get "/app/port"}}{{.Key}}={{.Value}}{{end}}`, want: "/app/port=8080"},
		{name: "get missing", tmpl: `{{get "/nope"}}`, wantErr: "error calling get: key does not exist: /nope"},
		{name: "gets sorted by key", tmpl: `{{range gets "/app/upstream/*"}}{{base .Key}}={{.Value}} {{end}}`,
			want: "a=10.0.0.3:80 b=10.0.0.2:80 c=10.0.0.1:80 "},
		{name: "gets star stops at slash", tmpl: `{{range gets "/app/*"}}{{.Key}} {{end}}`, want: "/app/port "},
		{name: "gets no match", tmpl: `{{gets "/nope/*"}}`, want: "[]"},
		{name: "gets bad pattern", tmpl: `{{gets "/app/["}}`, wantErr: "error calling gets: syntax error in pattern"},
		{name: "getv", tmpl: `{{getv "/app/db/user"}}`, want: "admin"},
		{name: "getv default", tmpl: `{{getv "/nope" "fallback"}}`, want: "fallback"},
		{name: "getv empty default", tmpl: `[{{getv "/nope" ""}}]`, want: "[]"},
		{name: "getv default ignored when key exists", tmpl: `{{getv "/app/port" "1"}}`, want: "8080"},
		{name: "getv empty value beats default", tmpl: `[{{getv "/empty" "d"}}]`, want: "[]"},
		{name: "getv missing", tmpl: `{{getv "/nope"}}`, wantErr: "error calling getv: key does not exist: /nope"},
		{name: "getvs sorted by value", tmpl: `{{range getvs "/app/upstream/*"}}{{.}} {{end}}`,
			want: "10.0.0.1:80 10.0.0.2:80 10.0.0.3:80 "},
		{name: "getvs no match", tmpl: `{{getvs "/nope/*"}}`, want: "[]"},
		{name: "exists", tmpl: `{{exists "/app/port"}} {{exists "/nope"}} {{exists "/app"}}`, want: "true false false"},

		{name: "ls root lists only top-level leaves", tmpl: `{{ls "/"}}`, want: "[empty top]"},
		{name: "lsdir root is empty", tmpl: `{{lsdir "/"}}`, want: "[]"},
		{name: "ls dir", tmpl: `{{ls "/app"}}`, want: "[db port upstream]"},
		{name: "ls trailing slash", tmpl: `{{ls "/app/"}}`, want: "[db port upstream]"},
		{name: "lsdir dir", tmpl: `{{lsdir "/app"}}`, want: "[db upstream]"},
		{name: "ls leaves and leaf-dir", tmpl: `{{ls "/app/upstream"}}`, want: "[a b c]"},
		{name: "lsdir leaf-dir", tmpl: `{{lsdir "/app/upstream"}}`, want: "[c]"},
		{name: "ls of a key is its base", tmpl: `{{ls "/app/port"}}`, want: "[port]"},
		{name: "ls missing", tmpl: `{{ls "/nope"}} {{lsdir "/nope"}}`, want: "[] []"},
		{name: "ls partial name does not match", tmpl: `{{ls "/ap"}}`, want: "[]"},
	})
}

func TestStringFuncs(t *testing.T) {
	runFuncCases(t, nestedKVs, []funcCase{
		{name: "base dir", tmpl: `{{base "/app/db/user"}} {{dir "/app/db/user"}} {{dir "/top"}}`, want: "user /app/db /"},
		{name: "split join", tmpl: `{{join (split "a:b:c" ":") ","}}`, want: "a,b,c"},
		{name: "split index", tmpl: `{{index (split (getv "/app/upstream/a") ":") 1}}`, want: "80"},
		{name: "case", tmpl: `{{toUpper "Value"}} {{toLower "Value"}}`, want: "VALUE value"},
		{name: "contains", tmpl: `{{contains "golang, java" "java"}} {{contains "golang" "rust"}}`, want: "true false"},
		{name: "replace all", tmpl: `{{replace "a-b-c" "-" "_" -1}}`, want: "a_b_c"},
		{name: "replace n", tmpl: `{{replace "a-b-c" "-" "_" 1}}`, want: "a_b-c"},
		{name: "trimSuffix", tmpl: `{{trimSuffix "host.example.com." "."}}`, want: "host.example.com"},
		{name: "datetime is time.Time", tmpl: `{{printf "%T" datetime}}`, want: "time.Time"},
		{name: "parseBool", tmpl: `{{parseBool "true"}} {{parseBool "0"}}`, want: "true false"},
		{name: "parseBool invalid", tmpl: `{{parseBool "yes"}}`, wantErr: `error calling parseBool: parseBool: value (3 bytes, not shown) is not a boolean: invalid syntax`},
		{name: "atoi", tmpl: `{{add (atoi "40") 2}}`, want: "42"},
		{name: "atoi invalid", tmpl: `{{atoi "x"}}`, wantErr: `error calling atoi: atoi: value (1 bytes, not shown) is not an integer: invalid syntax`},
		{name: "base64 encode", tmpl: `{{base64Encode "Value"}}`, want: "VmFsdWU="},
		{name: "base64 decode", tmpl: `{{base64Decode "VmFsdWU="}}`, want: "Value"},
		{name: "base64 round trip", tmpl: `{{base64Decode (base64Encode "héllo\nwörld")}}`, want: "héllo\nwörld"},
		{name: "base64 decode invalid", tmpl: `{{base64Decode "!!"}}`, wantErr: "error calling base64Decode: base64Decode: value (2 bytes, not shown): illegal base64 data at input byte 0"},
	})
}

func TestJSONAndMapFuncs(t *testing.T) {
	runFuncCases(t, nestedKVs, []funcCase{
		{name: "json fields", tmpl: `{{$d := json (getv "/json/obj")}}{{$d.name}} {{index $d.tags 1}} {{$d.n}} {{$d.nested.k}}`,
			want: "es b 1.5 true"},
		// Numbers are float64, so large ones print in exponent form.
		{name: "json print", tmpl: `{{json (getv "/json/obj")}}`,
			want: "map[big:1e+08 n:1.5 name:es nested:map[k:true] tags:[a b]]"},
		{name: "json invalid", tmpl: `{{json "x"}}`, wantErr: "error calling json: json: value (1 bytes, not shown) is not valid JSON: syntax error at byte 1"},
		{name: "json of array", tmpl: `{{json (getv "/json/arr")}}`, wantErr: "error calling json: json: value (20 bytes, not shown) holds a JSON array where map[string]interface {} is expected"},
		// JSON null is a nil interface, which text/template prints as "<no value>".
		{name: "jsonArray", tmpl: `{{range jsonArray (getv "/json/arr")}}[{{.}}]{{end}}`, want: "[1][2][true][<no value>]"},
		{name: "jsonArray of object", tmpl: `{{jsonArray (getv "/json/obj")}}`, wantErr: "error calling jsonArray: jsonArray: value (74 bytes, not shown) holds a JSON object where []interface {} is expected"},
		{name: "map", tmpl: `{{$m := map "name" "es" "port" 9200}}{{$m.name}}:{{index $m "port"}}`, want: "es:9200"},
		{name: "map to sub-template", tmpl: `{{define "srv"}}{{.host}}:{{.port}}{{end}}{{template "srv" (map "host" "h" "port" 1)}}`, want: "h:1"},
		{name: "map empty", tmpl: `{{map}}`, want: "map[]"},
		{name: "map odd args", tmpl: `{{map "a" 1 "b"}}`, wantErr: "error calling map: invalid map call"},
		{name: "map non-string key", tmpl: `{{map 1 2}}`, wantErr: "error calling map: map keys must be strings"},
	})
}

func TestArithmeticAndListFuncs(t *testing.T) {
	runFuncCases(t, nestedKVs, []funcCase{
		{name: "arithmetic", tmpl: `{{add 2 3}} {{sub 2 3}} {{mul 2 3}} {{div 7 2}} {{mod 7 2}} {{div -7 2}} {{mod -7 2}}`,
			want: "5 -1 6 3 1 -3 -1"},
		{name: "div by zero", tmpl: "x\n{{div 1 0}}", wantErr: `test.conf.tmpl:2:2: executing "test.conf.tmpl" at <div 1 0>: error calling div: runtime error: integer divide by zero`},
		{name: "mod by zero", tmpl: `{{mod 1 0}}`, wantErr: "error calling mod: runtime error: integer divide by zero"},
		{name: "seq", tmpl: `{{seq 1 3}} {{seq 2 2}} {{seq -1 1}}`, want: "[1 2 3] [2] [-1 0 1]"},
		{name: "seq descending is empty", tmpl: `{{seq 3 1}}|{{range seq 3 1}}x{{else}}none{{end}}`, want: "[]|none"},
		{name: "seq range", tmpl: `{{range $i := seq 1 3}}{{$i}},{{end}}`, want: "1,2,3,"},

		{name: "reverse strings", tmpl: `{{reverse (split "a,b,c" ",")}}`, want: "[c b a]"},
		{name: "reverse is in place", tmpl: `{{$v := getvs "/app/upstream/*"}}{{$_ := reverse $v}}{{join $v " "}}`,
			want: "10.0.0.3:80 10.0.0.2:80 10.0.0.1:80"},
		// gets returns memkv.KVPairs, not []memkv.KVPair: confd's reverse
		// leaves it as it is.
		{name: "reverse of gets is unchanged", tmpl: `{{range reverse (gets "/app/upstream/*")}}{{base .Key}}{{end}}`, want: "abc"},
		{name: "reverse of KVPair slice", tmpl: `{{range reverse (sortKVByLength (gets "/app/upstream/*"))}}{{base .Key}}{{end}}`, want: "cba"},
		{name: "reverse other types unchanged", tmpl: `{{reverse (seq 1 3)}} {{reverse "abc"}}`, want: "[1 2 3] abc"},
		{name: "reverse empty", tmpl: `{{reverse (getvs "/nope/*")}}`, want: "[]"},

		{name: "sortByLength", tmpl: `{{sortByLength (split "ccc,a,bb,dd,e" ",")}}`, want: "[a e bb dd ccc]"},
		{name: "sortByLength in place", tmpl: `{{$v := split "ccc,a,bb" ","}}{{$_ := sortByLength $v}}{{$v}}`, want: "[a bb ccc]"},
		{name: "sortKVByLength", tmpl: `{{range sortKVByLength (gets "/len/*")}}{{.Key}}={{.Value}} {{end}}`,
			want: "/len/b=one /len/a1=two /len/c22=three "},
	})
}

func TestGetenv(t *testing.T) {
	t.Setenv("CONFD_T_SET", "value")
	t.Setenv("CONFD_T_EMPTY", "")
	// Unset explicitly in case the outer environment has it.
	t.Setenv("CONFD_T_UNSET", "")
	os.Unsetenv("CONFD_T_UNSET")
	runFuncCases(t, nil, []funcCase{
		{name: "set", tmpl: `{{getenv "CONFD_T_SET" "d"}}`, want: "value"},
		{name: "unset with default", tmpl: `{{getenv "CONFD_T_UNSET" "d"}}`, want: "d"},
		{name: "empty with default", tmpl: `{{getenv "CONFD_T_EMPTY" "d"}}`, want: "d"},
		{name: "unset without default", tmpl: `[{{getenv "CONFD_T_UNSET"}}]`, want: "[]"},
	})
}

func TestFileExists(t *testing.T) {
	runFuncCases(t, nil, []funcCase{
		{name: "exists", tmpl: `{{fileExists "testdata/pem-bundle.tmpl"}}`, want: "true"},
		{name: "directory", tmpl: `{{fileExists "testdata"}}`, want: "true"},
		{name: "missing", tmpl: `{{fileExists "testdata/nope"}}`, want: "false"},
		// ENOTDIR is not "not exist", so confd reports true here.
		{name: "below a file", tmpl: `{{fileExists "testdata/pem-bundle.tmpl/x"}}`, want: "true"},
	})
}
