package preflight

import (
	"os"
	"path/filepath"
	"testing"
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

func TestControllerManagerKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tt := range []struct {
		files []string
		want  string
	}{
		{[]string{write("kube-controller-manager.yaml", kcmManifest)}, "/etc/kubernetes/pki/sa.key"},
		{[]string{write("kcm.env", "KUBE_CONTROLLER_MANAGER_ARGS=\"--service-account-private-key-file /srv/a.key --leader-elect=true\"\n")}, "/srv/a.key"},
		// The last occurrence wins, as for the apiserver's single-valued flags.
		{[]string{write("one.env", "A=\"--service-account-private-key-file=/one\"\n"), write("two.env", "B=\"--service-account-private-key-file=/two\"\n")}, "/two"},
		{[]string{write("none.env", "A=\"--leader-elect=true\"\n")}, ""},
	} {
		got, err := ControllerManagerKeyFile(tt.files)
		if err != nil || got != tt.want {
			t.Errorf("%v: %q, %v; want %q", tt.files, got, err, tt.want)
		}
	}
	if _, err := ControllerManagerKeyFile([]string{filepath.Join(dir, "missing")}); err == nil {
		t.Error("a missing flags file passed")
	}
}
