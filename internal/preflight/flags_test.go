package preflight

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestExtractFlags(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []string // "flag=value@line"
		errs []string // substrings, one per expected error
	}{
		{
			name: "systemd EnvironmentFile",
			file: `# kube-apiserver settings
; an ini-style comment
KUBE_API_ADDRESS="--bind-address=0.0.0.0"
KUBE_API_ARGS="--service-account-key-file=/a/sa.pub --tls-cert-file /x.crt \
  --tls-private-key-file='/x y.key'"
export KUBE_EXTRA='--service-account-key-file=/b/sa.pub'
KUBE_PLAIN=--client-ca-file=/ca.crt
`,
			want: []string{"service-account-key-file=/a/sa.pub@4", "tls-cert-file=/x.crt@4",
				"tls-private-key-file=/x y.key@4", "service-account-key-file=/b/sa.pub@6", "client-ca-file=/ca.crt@7"},
		},
		{
			name: "one flag per line",
			file: `--service-account-key-file=/etc/k/sa-1.pub
--service-account-key-file /etc/k/sa-2.pub

--tls_cert_file=/c.crt   # underscores are normalised; trailing comment
--client-ca-file "/ca dir/ca.crt"
--etcd-servers=https://10.0.0.1:2379
--etcd-cafile
/etcd/ca.crt
`,
			want: []string{"service-account-key-file=/etc/k/sa-1.pub@1", "service-account-key-file=/etc/k/sa-2.pub@2",
				"tls-cert-file=/c.crt@4", "client-ca-file=/ca dir/ca.crt@5", "etcd-cafile=/etcd/ca.crt@7"},
		},
		{
			name: "static pod manifest",
			file: `apiVersion: v1
kind: Pod
spec:
  containers:
  - command:
    - kube-apiserver
    - --advertise-address=10.0.0.1
    - --service-account-key-file=/etc/kubernetes/pki/sa.pub
    - "--tls-cert-file=/etc/kubernetes/pki/apiserver.crt"
    # - --client-ca-file=/commented/out
    - --proxy-client-key-file=/etc/kubernetes/pki/front-proxy-client.key  # comment
    image: registry.k8s.io/kube-apiserver:v1.31.0
`,
			want: []string{"service-account-key-file=/etc/kubernetes/pki/sa.pub@8",
				"tls-cert-file=/etc/kubernetes/pki/apiserver.crt@9",
				"proxy-client-key-file=/etc/kubernetes/pki/front-proxy-client.key@11"},
		},
		{
			name: "ExecStart with continuations",
			file: "ExecStart=/usr/local/bin/kube-apiserver \\\n  --tls-cert-file=/a.crt \\\n  --tls-private-key-file=/a.key \\\n  $KUBE_API_ARGS\n",
			want: []string{"tls-cert-file=/a.crt@1", "tls-private-key-file=/a.key@1"},
		},
		{
			name: "CRLF",
			file: "--tls-cert-file=/a.crt\r\n--tls-private-key-file=/a.key\r\n",
			want: []string{"tls-cert-file=/a.crt@1", "tls-private-key-file=/a.key@2"},
		},
		{
			name: "bad values",
			file: "--client-ca-file=\n--tls-cert-file --tls-private-key-file=/k\nA=\"--etcd-cafile=/x\n--etcd-keyfile\n",
			want: []string{"tls-private-key-file=/k@2"},
			// The unterminated quote swallows the rest of the file.
			errs: []string{"f:3: unterminated quote", "f:1: --client-ca-file has an empty value",
				"f:2: --tls-cert-file has no value"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			toks, errs := tokenize("f", []byte(tc.file))
			occ, ferrs := extractFlags("f", toks, apiserverFlags())
			errs = append(errs, ferrs...)
			var got []string
			for _, o := range occ {
				got = append(got, fmt.Sprintf("%s=%s@%d", o.flag, o.value, o.line))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("flags:\n got %q\nwant %q", got, tc.want)
			}
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors %v, want %d", errs, len(tc.errs))
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tc.errs[i]) {
					t.Errorf("error %q does not contain %q", e, tc.errs[i])
				}
			}
		})
	}
}

func TestEffective(t *testing.T) {
	specs := apiserverFlags()
	occ := []occurrence{
		{flag: "tls-cert-file", value: "/old.crt"},
		{flag: "service-account-key-file", value: "/a.pub"},
		{flag: "service-account-key-file", value: "/b.pub"},
		{flag: "tls-cert-file", value: "/new.crt"},
	}
	var got []string
	for _, o := range effective(occ, specs) {
		got = append(got, o.value)
	}
	if want := []string{"/a.pub", "/b.pub", "/new.crt"}; !slices.Equal(got, want) {
		t.Errorf("effective = %q, want %q", got, want)
	}
}

func TestSplitWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{`a  b	c`, []string{"a", "b", "c"}},
		{`"a b" 'c d' e\ f`, []string{"a b", "c d", "e f"}},
		{`"x\"y\$z\q"`, []string{`x"y$z\q`}},
		{`--a='it'"'"'s'`, []string{"--a=it's"}},
		{"a \\\nb", []string{"a", "b"}},
		{"a # b c\nd", []string{"a", "d"}},
		{"a#b", []string{"a#b"}},
		{`""`, []string{""}},
	}
	for _, tc := range tests {
		got, err := splitWords(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`"a`, `'a`, `a "b\"`} {
		if _, err := splitWords(bad); err != errUnterminated {
			t.Errorf("splitWords(%q) err = %v, want unterminated", bad, err)
		}
	}
}

func TestServiceAccountFiles(t *testing.T) {
	dir := t.TempDir()
	env := dir + "/apiserver.env"
	body := "KUBE_APISERVER_SA_ARGS=\"--service-account-key-file=/a.pem --service-account-signing-key-file=/old.key\"\n" +
		"--service-account-key-file /b.pem\n--service-account-signing-key-file=/sa.key\n--tls-cert-file=/tls.crt\n"
	if err := os.WriteFile(env, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, signing, err := ServiceAccountFiles([]string{env})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "/a.pem,/b.pem" || signing != "/sa.key" {
		t.Fatalf("got keys %q signing %q, want /a.pem,/b.pem and /sa.key (the last signing key wins)", keys, signing)
	}
	if _, _, err := ServiceAccountFiles([]string{dir + "/missing.env"}); err == nil {
		t.Fatal("a missing flags file gave no error")
	}
}
