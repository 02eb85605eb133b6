package saferestart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// fakeCrictl answers crictl's ps and stop for one kube-apiserver container
// (its ID in STATE/id); after a stop, the kubelet's back-off lasts one more
// look, then a container "new" runs. Every call is logged in STATE/calls.
const fakeCrictl = `#!/bin/sh
s="$CRICTL_STATE"
echo "$*" >>"$s/calls"
case " $* " in
*" stop "*) touch "$s/stopped" ;;
*" ps "*)
	if [ -f "$s/stopped" ]; then
		n=$(($(cat "$s/polls" 2>/dev/null || echo 0) + 1)); echo $n >"$s/polls"
		if [ $n -ge 2 ]; then rm "$s/stopped"; echo new >"$s/id"; fi
	fi
	if [ -f "$s/stopped" ]; then echo '{"containers": []}'; exit 0; fi
	printf '{"containers":[{"id":"%s","metadata":{"name":"kube-apiserver","attempt":1},"state":"CONTAINER_RUNNING","createdAt":"1","labels":{"io.kubernetes.pod.namespace":"kube-system"}}]}\n' "$(cat "$s/id")" ;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac
`

// TestStaticPodMode: --restart-mode static-pod stops the running
// kube-apiserver container through crictl and returns once the kubelet runs
// another; no systemctl, no manifest.
func TestStaticPodMode(t *testing.T) {
	s := etcdtest.Start(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "crictl"), []byte(fakeCrictl), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "id"), []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := env(s, "CRICTL_STATE="+state)
	for i, v := range e {
		if strings.HasPrefix(v, "PATH=") {
			e[i] = "PATH=" + filepath.Join(dir, "bin") + ":" + strings.TrimPrefix(v, "PATH=")
		}
	}
	p := runBin(t, e, lockArgs("static-pod", "--restart-mode", "static-pod", "--cri-endpoint", "unix:///run/containerd/containerd.sock", "--static-pod-stop-timeout", "7s")...)
	if p.code != codeOK {
		t.Fatalf("exit %d:\n%s", p.code, p.stderr)
	}
	calls, err := os.ReadFile(filepath.Join(state, "calls"))
	if err != nil {
		t.Fatal(err)
	}
	ps := "--runtime-endpoint unix:///run/containerd/containerd.sock ps --name ^kube-apiserver$ --namespace ^kube-system$ --state running -o json"
	want := strings.Join([]string{ps, "--runtime-endpoint unix:///run/containerd/containerd.sock stop --timeout 7 old", ps, ps}, "\n") + "\n"
	if string(calls) != want {
		t.Errorf("crictl calls:\n%s\nwant:\n%s", calls, want)
	}
	if !strings.Contains(p.stderr.String(), "kubelet runs a new kube-apiserver container new") {
		t.Errorf("the new container is not reported:\n%s", p.stderr)
	}
}
