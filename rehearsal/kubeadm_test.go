//go:build rehearsal

package rehearsal

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// standinMain runs the test binary's other roles (TestMain calls it first):
// REHEARSAL_STANDIN=uts sets this UTS namespace's host name and execs the
// apiserver, so that each master's apiserver keeps its own identity Lease
// (apiservers sharing a host name share one); =crictl is a host's crictl.
func standinMain() (int, bool) {
	switch os.Getenv("REHEARSAL_STANDIN") {
	case "uts":
		name := os.Getenv("REHEARSAL_HOSTNAME")
		if err := syscall.Sethostname([]byte(name)); err != nil {
			fmt.Fprintf(os.Stderr, "rehearsal uts: sethostname %q: %v\n", name, err)
			return 1, true
		}
		var env []string
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "REHEARSAL_") {
				env = append(env, e)
			}
		}
		err := syscall.Exec(os.Args[1], os.Args[1:], env)
		fmt.Fprintf(os.Stderr, "rehearsal uts: exec %s: %v\n", os.Args[1], err)
		return 1, true
	case "crictl":
		return crictlMain(os.Getenv("REHEARSAL_KUBELET"), os.Args[1:]), true
	}
	return 0, false
}

// inUTS wraps the apiserver's command so that it runs in a UTS namespace of
// its own under the host's name (needs root, as the rehearsal has).
func inUTS(h *host, argv, env []string) ([]string, []string, *syscall.SysProcAttr) {
	self, err := os.Executable()
	if err != nil {
		h.t.Fatal(err)
	}
	return append([]string{self}, argv...),
		append(append([]string(nil), env...), "REHEARSAL_STANDIN=uts", "REHEARSAL_HOSTNAME="+h.name),
		&syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWUTS}
}

// kubelet stands in for a kubeadm master's kubelet and container runtime,
// for the one static pod the helper restarts: kube-apiserver, run by the
// host's stand-in systemd as its container. Its ID changes with every
// start. `crictl stop` stops it (SIGTERM); after a back-off the kubelet
// starts it again, as it restarts any static pod container that exited.
type kubelet struct {
	h       *host
	ln      net.Listener
	backOff time.Duration
	mu      sync.Mutex
	calls   []string
	stops   atomic.Int64
	// supervised: supervise runs the container (it starts it again
	// whenever it exits), not the stop's own restart.
	supervised atomic.Bool
}

func startKubelet(t *testing.T, h *host, backOff time.Duration) *kubelet {
	t.Helper()
	sock := h.Path("/run/kubelet-standin.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{h: h, ln: ln, backOff: backOff}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h.write("/bin/crictl", fmt.Sprintf("#!/bin/sh\nREHEARSAL_STANDIN=crictl REHEARSAL_KUBELET=%s exec %s \"$@\"\n", sock, self), 0o755)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go k.handle(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); _ = os.Remove(h.Path("/bin/crictl")) })
	return k
}

// containerID is the running apiserver's container ID, "" when none runs.
func (k *kubelet) containerID() string {
	s := k.h.systemd
	s.job.Lock()
	defer s.job.Unlock()
	if s.cmd == nil {
		return ""
	}
	select {
	case <-s.exited: // exited (a crash-looping container): not running
		return ""
	default:
	}
	return fmt.Sprintf("%064x", s.restarts.Load())
}

func (k *kubelet) handle(c net.Conn) {
	defer c.Close()
	line, err := readLine(bufio.NewReader(c))
	if err != nil {
		return
	}
	k.mu.Lock()
	k.calls = append(k.calls, line)
	k.mu.Unlock()
	args := strings.Fields(line)
	// Global flags first, as crictl takes them.
	for len(args) > 1 && args[0] == "--runtime-endpoint" {
		args = args[2:]
	}
	switch {
	case len(args) > 0 && args[0] == "ps":
		type ctr struct {
			ID       string            `json:"id"`
			Metadata map[string]any    `json:"metadata"`
			State    string            `json:"state"`
			Created  string            `json:"createdAt"`
			Labels   map[string]string `json:"labels"`
		}
		out := struct {
			Containers []ctr `json:"containers"`
		}{Containers: []ctr{}}
		if id := k.containerID(); id != "" {
			out.Containers = append(out.Containers, ctr{ID: id, Metadata: map[string]any{"name": "kube-apiserver", "attempt": k.h.systemd.restarts.Load()},
				State: "CONTAINER_RUNNING", Created: fmt.Sprint(time.Now().UnixNano()), Labels: map[string]string{"io.kubernetes.pod.namespace": "kube-system"}})
		}
		data, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintf(c, "0\n%s\n", data)
	case len(args) == 4 && args[0] == "stop" && args[1] == "--timeout":
		if args[3] != k.containerID() {
			fmt.Fprintf(c, "1\ncontainer %q not found\n", args[3])
			return
		}
		k.stops.Add(1)
		k.h.systemd.stopUnit()
		if k.supervised.Load() {
			fmt.Fprintf(c, "0\n%s\n", args[3])
			return
		}
		go func() {
			time.Sleep(k.backOff) // the kubelet's restart back-off, not a wait for an outcome
			if err := k.h.systemd.restart(func(string) {}); err != nil {
				k.h.t.Logf("%s kubelet stand-in: start kube-apiserver: %v", k.h.name, err)
			}
		}()
		fmt.Fprintf(c, "0\n%s\n", args[3])
	default:
		fmt.Fprintf(c, "1\ncrictl stand-in: unsupported: %s\n", line)
	}
}

// supervise makes k run the apiserver's static pod as the kubelet does on
// a kubeadm master: whenever its container exits (a crash, crictl stop,
// a reimaged master's apiserver whose signing key link is not there yet)
// it starts a new one after a back-off that doubles up to 4× the first
// while the container keeps exiting. The returned func stops the kubelet
// (the running container is left as it is).
func (k *kubelet) supervise() (stop func()) {
	k.supervised.Store(true)
	quit, done := make(chan struct{}), make(chan struct{})
	s := k.h.systemd
	go func() {
		defer close(done)
		backOff := k.backOff
		var startedAt time.Time
		for {
			s.job.Lock()
			running, exited := s.cmd != nil, s.exited
			s.job.Unlock()
			if running {
				select {
				case <-exited:
				case <-quit:
					return
				}
				if !startedAt.IsZero() && time.Since(startedAt) < 30*time.Second {
					backOff = min(2*backOff, 4*k.backOff)
				} else {
					backOff = k.backOff
				}
			}
			select {
			case <-time.After(backOff): // the kubelet's back-off, not a wait for an outcome
			case <-quit:
				return
			}
			if err := s.restart(func(string) {}); err != nil {
				k.h.t.Logf("%s kubelet stand-in: start kube-apiserver: %v", k.h.name, err)
			}
			startedAt = time.Now()
		}
	}()
	return func() {
		close(quit)
		<-done
		k.supervised.Store(false)
	}
}

// crictlMain is a host's crictl: it forwards its arguments to the host's
// kubelet stand-in and prints its answer (exit status first line).
func crictlMain(socket string, args []string) int {
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "crictl: %v\n", err)
		return 1
	}
	defer c.Close()
	fmt.Fprintf(c, "%s\n", strings.Join(args, " "))
	r := bufio.NewReader(c)
	code, err := readLine(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "crictl: %v\n", err)
		return 1
	}
	rest := new(strings.Builder)
	_, _ = bufio.NewReader(r).WriteTo(rest)
	if code != "0" {
		fmt.Fprint(os.Stderr, rest.String())
		return 1
	}
	fmt.Print(rest.String())
	return 0
}

// staticPod restarts m1's apiserver as a kubeadm master's: the helper with
// --restart-mode static-pod stops its container through crictl, the
// kubelet stand-in starts a new one after its back-off, the gate waits for
// it; no systemctl, no manifest edit; converged, 9 of 9.
func (f *fleet) staticPod(t *testing.T) {
	h := f.hosts[0]
	k := startKubelet(t, h, 2*time.Second)
	// No systemctl on a kubeadm master: a call would fail the restart.
	h.write("/bin/systemctl", "#!/bin/sh\necho \"systemctl must not run in static-pod mode: $*\" >&2\nexit 1\n", 0o755)
	t.Cleanup(func() {
		self, _ := os.Executable()
		h.write("/bin/systemctl", fmt.Sprintf("#!/bin/sh\nREHEARSAL_STANDIN=systemctl REHEARSAL_SYSTEMD=%s exec %s \"$@\"\n", h.Path("/run/systemd/private"), self), 0o755)
	})
	before := f.restarts()
	oldID := k.containerID()
	code, out := h.helper(t, append(h.gateArgs(), "restart", "--host", h.name, "--restart-mode", "static-pod", "--cri-endpoint", "unix:///run/containerd/containerd.sock",
		"--static-pod-stop-timeout", "20s")...)
	if code != 0 {
		t.Fatalf("static-pod restart exited %d:\n%s", code, out)
	}
	after := f.restarts()
	if after[0] != before[0]+1 || k.stops.Load() != 1 || k.containerID() == oldID {
		t.Errorf("m1 started %d times, %d stops, container %s (was %s); want one restart with a new container", after[0]-before[0], k.stops.Load(), k.containerID(), oldID)
	}
	k.mu.Lock()
	calls := strings.Join(k.calls, "\n")
	k.mu.Unlock()
	wantStop := "--runtime-endpoint unix:///run/containerd/containerd.sock stop --timeout 20 " + oldID
	if !strings.Contains(calls, wantStop) || !strings.HasPrefix(calls, "--runtime-endpoint unix:///run/containerd/containerd.sock ps --name ^kube-apiserver$ --namespace ^kube-system$ --state running -o json") {
		t.Errorf("crictl calls:\n%s\nwant a ps, then %q", calls, wantStop)
	}
	if !strings.Contains(out, "apiserver ready") {
		t.Errorf("no health gate after the new container:\n%s", out)
	}
	f.awaitConverged(t, 2*time.Minute)
	f.assertAllTokensAccepted(t)
}

// writeKubeconfig gives h an admin kubeconfig for its own apiserver, as
// kubeadm's /etc/kubernetes/admin.conf (client certificate in
// system:masters).
func (h *host) writeKubeconfig() string {
	pki := h.Path("/etc/kubernetes/pki/")
	h.write("/etc/kubernetes/admin.conf", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fleet
  cluster: {server: %q, certificate-authority: %q}
users:
- name: admin
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: admin@fleet
  context: {cluster: fleet, user: admin}
current-context: admin@fleet
`, h.APIServerURL, pki+"ca.crt", pki+"apiserver-kubelet-client.crt", pki+"apiserver-kubelet-client.key"), 0o600)
	return h.Path("/etc/kubernetes/admin.conf")
}

// leaseAges reads the apiservers' identity Leases from h's apiserver:
// host name -> time since its last renewal.
func (f *fleet) leaseAges(t *testing.T, h *host) map[string]time.Duration {
	t.Helper()
	resp, err := f.admin.Get(h.APIServerURL + "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Items []struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				RenewTime time.Time `json:"renewTime"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Duration{}
	for _, l := range list.Items {
		out[l.Metadata.Labels["kubernetes.io/hostname"]] = time.Since(l.Spec.RenewTime)
	}
	return out
}

// fleetCheck: each apiserver keeps its own identity Lease (own host name);
// with all three live a restart of m1 passes the fleet check; with m3's
// apiserver stopped, m1's restart waits --fleet-timeout and exits 5 naming
// m3, nothing restarted, no hold; m3 back: converged.
func (f *fleet) fleetCheck(t *testing.T) {
	m1, m3 := f.hosts[0], f.hosts[2]
	kc := m1.writeKubeconfig()
	var ages map[string]time.Duration
	f.await(t, time.Minute, "an identity Lease per master", func() bool {
		ages = f.leaseAges(t, m1)
		for _, h := range f.hosts {
			if a, ok := ages[h.name]; !ok || a > 15*time.Second {
				return false
			}
		}
		return true
	})
	t.Logf("identity Leases: %v", ages)
	args := append(m1.gateArgs(), "restart", "--host", m1.name, "--kubeconfig", kc, "--fleet-lease-age", "15s", "--fleet-timeout", "20s")
	before := f.restarts()
	if code, out := m1.helper(t, args...); code != 0 || !strings.Contains(out, "fleet check before queueing: 2 of 2 other apiservers live") {
		t.Fatalf("with every apiserver live: exit %d:\n%s", code, out)
	}
	if f.restarts()[0] != before[0]+1 {
		t.Fatalf("m1 not restarted once")
	}
	f.awaitConverged(t, 2*time.Minute)

	// SIGKILL, as a crash or a lost host: an apiserver stopped gracefully
	// deletes its identity Lease on exit ("Cleaning up lease on exit",
	// v1.37.2), and the Leases alone then no longer show it.
	m3.systemd.killUnit()
	restarted := false
	t.Cleanup(func() { // a failure must not leave m3 down for the next scenario
		if !restarted {
			_ = m3.systemd.restart(func(string) {})
		}
	})
	f.await(t, time.Minute, "m3's Lease older than --fleet-lease-age", func() bool { return f.leaseAges(t, m1)[m3.name] > 16*time.Second })
	before = f.restarts()
	code, out := m1.helper(t, args...)
	if code != 5 || !strings.Contains(out, m3.name+" (renewed") || strings.Contains(out, m1.f.hosts[1].name+" (renewed") {
		t.Fatalf("with m3 stopped: exit %d (want 5, naming m3 only):\n%s", code, out)
	}
	if after := f.restarts(); after[0] != before[0] {
		t.Errorf("m1 restarted while m3 was down")
	}
	if h, ok := f.hold(t); ok {
		t.Errorf("hold written for a degraded fleet: %s", h)
	}
	t.Logf("exit 5 naming %s after --fleet-timeout 20s", m3.name)
	restarted = true
	if err := m3.systemd.restart(func(string) {}); err != nil {
		t.Fatal(err)
	}
	f.awaitConverged(t, 2*time.Minute)

	// Stopped gracefully, m3's apiserver deletes its Lease; m3 still
	// publishes its key and records trust, so it is still expected.
	m3.systemd.stopUnit()
	restarted = false
	if _, ok := f.leaseAges(t, m1)[m3.name]; ok {
		t.Logf("m3's Lease outlived its graceful stop")
	}
	before = f.restarts()
	code, out = m1.helper(t, append(args[:len(args):len(args)], "--fleet-timeout", "3s")...)
	if code != 5 || !strings.Contains(out, m3.name+" (no identity Lease)") {
		t.Fatalf("with m3 stopped gracefully: exit %d (want 5, naming m3):\n%s", code, out)
	}
	if after := f.restarts(); after[0] != before[0] {
		t.Errorf("m1 restarted while m3 was down")
	}
	t.Logf("graceful stop: exit 5 naming %s (no identity Lease)", m3.name)
	restarted = true
	if err := m3.systemd.restart(func(string) {}); err != nil {
		t.Fatal(err)
	}
	f.awaitConverged(t, 2*time.Minute)
	f.assertAllTokensAccepted(t)
}

// gateArgs are the health gate's flags of the shipped unit, with the site's
// test-sized timings, for a helper run by hand.
func (h *host) gateArgs() []string {
	pki := h.Path("/etc/kubernetes/pki/")
	return []string{"--attempts=1", "--health-timeout=40s", "--health-settle=3s", "--health-interval=250ms", "--lock-timeout=8m",
		"--health-url", h.APIServerURL + "/readyz", "--health-cacert", pki + "ca.crt",
		"--health-cert", pki + "apiserver-kubelet-client.crt", "--health-key", pki + "apiserver-kubelet-client.key"}
}

// killUnit SIGKILLs the apiserver, as a crash would.
func (s *systemd) killUnit() {
	s.job.Lock()
	defer s.job.Unlock()
	s.h.f.tl.stopping(s.h.name)
	s.stop(syscall.SIGKILL)
}
