package cri

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// quiet is a logger that logs nothing.
var quiet = func() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.PanicLevel)
	return l
}()

func TestArgv(t *testing.T) {
	ep := Crictl{Endpoint: "unix:///run/containerd/containerd.sock"}
	for i, tt := range []struct {
		got  []string
		want string
	}{
		{Crictl{}.PsArgv("kube-apiserver", "kube-system"),
			`crictl ps --name ^kube-apiserver$ --namespace ^kube-system$ --state running -o json`},
		{ep.PsArgv("kube-controller-manager", "kube-system"),
			`crictl --runtime-endpoint unix:///run/containerd/containerd.sock ps --name ^kube-controller-manager$ --namespace ^kube-system$ --state running -o json`},
		{ep.StopArgv("abc", 30*time.Second), `crictl --runtime-endpoint unix:///run/containerd/containerd.sock stop --timeout 30 abc`},
		{Crictl{}.StopArgv("abc", 1500*time.Millisecond), `crictl stop --timeout 2 abc`}, // whole seconds, rounded up
		{Crictl{}.PsArgv("a.b", "x"), `crictl ps --name ^a\.b$ --namespace ^x$ --state running -o json`},
	} {
		if got := strings.Join(tt.got, " "); got != tt.want {
			t.Errorf("%d: %s\nwant %s", i, got, tt.want)
		}
	}
}

// psOutput is `crictl ps -o json` as cri-tools v1.37.0 prints it: protojson
// of ListContainersResponse, default values emitted, int64 as strings.
const psOutput = `{
  "containers": [
    {
      "id": "1f4b3c2a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a",
      "podSandboxId": "9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b",
      "metadata": {
        "name": "kube-apiserver",
        "attempt": 3
      },
      "image": {
        "image": "sha256:aaaa",
        "annotations": {},
        "userSpecifiedImage": "",
        "runtimeHandler": ""
      },
      "imageRef": "sha256:aaaa",
      "state": "CONTAINER_RUNNING",
      "createdAt": "1764676800123456789",
      "labels": {
        "io.kubernetes.container.name": "kube-apiserver",
        "io.kubernetes.pod.name": "kube-apiserver-m1",
        "io.kubernetes.pod.namespace": "kube-system",
        "io.kubernetes.pod.uid": "d1"
      },
      "annotations": {
        "io.kubernetes.container.restartCount": "3"
      },
      "imageId": ""
    },
    {
      "id": "2222",
      "podSandboxId": "",
      "metadata": {"name": "kube-apiserver", "attempt": 0},
      "state": "CONTAINER_EXITED",
      "createdAt": "1764676700000000000",
      "labels": {"io.kubernetes.pod.namespace": "kube-system"}
    }
  ]
}
`

func TestParsePs(t *testing.T) {
	got, err := ParsePs([]byte(psOutput))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d containers", len(got))
	}
	c := got[0]
	if c.ID != "1f4b3c2a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a" || c.Name != "kube-apiserver" || c.Attempt != 3 ||
		c.State != StateRunning || c.CreatedAt != 1764676800123456789 || c.Namespace != "kube-system" {
		t.Errorf("parsed %+v", c)
	}
	empty, err := ParsePs([]byte("{\n  \"containers\": []\n}\n"))
	if err != nil || len(empty) != 0 {
		t.Errorf("empty list: %v %v", empty, err)
	}
	for _, bad := range []string{"", "table output", `{"containers":[{"id":"x","createdAt":"soon"}]}`, `{"containers":[{"metadata":{"name":"kube-apiserver"}}]}`} {
		if _, err := ParsePs([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// fakeRuntime answers crictl's ps and stop like a container runtime whose
// kubelet starts a new container after stop.
type fakeRuntime struct {
	mu      sync.Mutex
	calls   []string
	running []string // IDs
	// afterStop is how many ps calls after a stop return nothing (the
	// kubelet's back-off) before the new container runs.
	afterStop, sinceStop int
	stopped              bool
	next                 string
	stopErr              error
}

func (f *fakeRuntime) run(_ context.Context, argv []string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, strings.Join(argv, " "))
	for _, a := range argv {
		switch a {
		case "stop":
			if f.stopErr != nil {
				return nil, f.stopErr
			}
			f.running, f.stopped = nil, true
			return []byte(argv[len(argv)-1] + "\n"), nil
		case "ps":
			if f.stopped && f.running == nil {
				f.sinceStop++
				if f.sinceStop > f.afterStop {
					f.running = []string{f.next}
				}
			}
			var b strings.Builder
			b.WriteString(`{"containers":[`)
			for j, id := range f.running {
				if j > 0 {
					b.WriteString(",")
				}
				b.WriteString(`{"id":"` + id + `","metadata":{"name":"kube-apiserver","attempt":1},"state":"CONTAINER_RUNNING","createdAt":"1","labels":{"io.kubernetes.pod.namespace":"kube-system"}}`)
			}
			b.WriteString("]}")
			return []byte(b.String()), nil
		}
	}
	return nil, errors.New("unexpected " + strings.Join(argv, " "))
}

// waitLimit bounds a test that would otherwise hang on a bug.
const waitLimit = 30 * time.Second

func TestRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	f := &fakeRuntime{running: []string{"old"}, next: "new", afterStop: 3}
	r := Restart{Crictl: Crictl{Endpoint: "unix:///cri.sock", Run: f.run}, Name: "kube-apiserver", Namespace: "kube-system", StopTimeout: 30 * time.Second, Interval: time.Millisecond, Log: quiet}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if f.calls[1] != "crictl --runtime-endpoint unix:///cri.sock stop --timeout 30 old" {
		t.Errorf("second call %q", f.calls[1])
	}
	// ps, stop, then ps until the new container: 3 empty answers (back-off), the 4th has it.
	if len(f.calls) != 2+4 {
		t.Errorf("calls %q", f.calls)
	}
}

// A name filter the runtime ignored must not make us stop another container.
func TestRunningChecksTheFilter(t *testing.T) {
	c := Crictl{Run: func(context.Context, []string) ([]byte, error) {
		return []byte(`{"containers":[{"id":"a","metadata":{"name":"kube-apiserver-proxy"},"state":"CONTAINER_RUNNING","labels":{"io.kubernetes.pod.namespace":"kube-system"}},` +
			`{"id":"b","metadata":{"name":"kube-apiserver"},"state":"CONTAINER_RUNNING","labels":{"io.kubernetes.pod.namespace":"default"}},` +
			`{"id":"c","metadata":{"name":"kube-apiserver"},"state":"CONTAINER_RUNNING","createdAt":"5","labels":{"io.kubernetes.pod.namespace":"kube-system"}},` +
			`{"id":"d","metadata":{"name":"kube-apiserver"},"state":"CONTAINER_RUNNING","createdAt":"9","labels":{"io.kubernetes.pod.namespace":"kube-system"}}]}`), nil
	}}
	got, err := c.Running(context.Background(), "kube-apiserver", "kube-system")
	if err != nil || len(got) != 2 || got[0].ID != "d" || got[1].ID != "c" {
		t.Fatalf("Running = %+v, %v; want d, c (newest first)", got, err)
	}
}

// No new container before the deadline: an error, after stopping the old.
func TestRestartNoNewContainer(t *testing.T) {
	f := &fakeRuntime{running: []string{"old"}, next: "new", afterStop: 1 << 30}
	r := Restart{Crictl: Crictl{Run: f.run}, Name: "kube-apiserver", Namespace: "kube-system", StopTimeout: time.Second, Interval: time.Millisecond, Log: quiet}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, ErrNotRunning) || !f.stopped {
		t.Fatalf("Run = %v, stopped %v", err, f.stopped)
	}
}

func TestRestartStopFails(t *testing.T) {
	f := &fakeRuntime{running: []string{"old"}, next: "new", stopErr: errors.New("rpc error: DeadlineExceeded")}
	r := Restart{Crictl: Crictl{Run: f.run}, Name: "kube-apiserver", Namespace: "kube-system", StopTimeout: time.Second, Interval: time.Millisecond, Log: quiet}
	if err := r.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "DeadlineExceeded") {
		t.Fatalf("Run = %v", err)
	}
}

// Nothing running (crash loop): no stop, the next container is enough.
func TestRestartNothingRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	f := &fakeRuntime{next: "new", stopped: true, afterStop: 1}
	r := Restart{Crictl: Crictl{Run: f.run}, Name: "kube-apiserver", Namespace: "kube-system", StopTimeout: time.Second, Interval: time.Millisecond, Log: quiet}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range f.calls {
		if strings.Contains(c, " stop ") {
			t.Errorf("stopped something: %q", c)
		}
	}
}
