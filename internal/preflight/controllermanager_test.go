package preflight

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/keytest"
)

// kubeadm's kube-controller-manager manifest, trimmed.
const kcmManifest = `apiVersion: v1
kind: Pod
metadata:
  name: kube-controller-manager
  namespace: kube-system
spec:
  containers:
  - command:
    - kube-controller-manager
    - --authentication-kubeconfig=/etc/kubernetes/controller-manager.conf
    - --root-ca-file=/etc/kubernetes/pki/ca.crt
    - --service-account-private-key-file=/etc/kubernetes/pki/sa.key
    - --use-service-account-credentials=true
    image: registry.k8s.io/kube-controller-manager:v1.37.2
    name: kube-controller-manager
`

func TestControllerManagerKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys := map[string]string{}
	for _, name := range []string{"sa.key", "a.key", "one", "two"} {
		k := keytest.EC(t)
		write(name, string(keytest.SEC1PEM(t, k)))
		keys[filepath.Join(dir, name)] = keytest.KeyID(t, k.Public())
	}
	for _, tt := range []struct {
		files []string
		want  string
	}{
		{[]string{write("kube-controller-manager.yaml", strings.ReplaceAll(kcmManifest, "/etc/kubernetes/pki", dir))}, filepath.Join(dir, "sa.key")},
		{[]string{write("kcm.env", "KUBE_CONTROLLER_MANAGER_ARGS=\"--service-account-private-key-file "+dir+"/a.key --leader-elect=true\"\n")}, filepath.Join(dir, "a.key")},
		// The last occurrence wins, as for the apiserver's single-valued flags.
		{[]string{write("one.env", "A=\"--service-account-private-key-file="+dir+"/one\"\n"), write("two.env", "B=\"--service-account-private-key-file="+dir+"/two\"\n")}, filepath.Join(dir, "two")},
		{[]string{write("none.env", "A=\"--leader-elect=true\"\n")}, ""},
		{nil, ""},
	} {
		got, kid, err := ControllerManagerKey(tt.files)
		if err != nil || got != tt.want || kid != keys[tt.want] {
			t.Errorf("%v: %q, %q, %v; want %q, %q", tt.files, got, kid, err, tt.want, keys[tt.want])
		}
	}
	if _, _, err := ControllerManagerKey([]string{filepath.Join(dir, "missing")}); err == nil {
		t.Error("a missing flags file passed")
	}
}
