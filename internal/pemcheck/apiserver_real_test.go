package pemcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/toolbin"
)

// TestRealAPIServerLoads feeds every file of apiserverCases to a real
// kube-apiserver as --service-account-key-file and checks the number of
// keys its /openid/v1/jwks serves against the recorded count: it is how
// the table's loaded column was obtained, and how it is re-checked. It
// needs kube-apiserver (`make kube-apiserver`, found by toolbin.Kube) and
// takes about 3 s per file, so it runs only when asked:
//
//	PEMCHECK_REMEASURE=1 go test ./internal/pemcheck -run TestRealAPIServerLoads -v
func TestRealAPIServerLoads(t *testing.T) {
	if os.Getenv("PEMCHECK_REMEASURE") == "" {
		t.Skip("PEMCHECK_REMEASURE not set: the recorded outcomes in apiserverCases are not re-measured")
	}
	bin := toolbin.Kube(t, "kube-apiserver")
	etcd := etcdtest.Start(t)
	// The JWKS needs an authenticated client: the test CA's client
	// certificate, trusted through --client-ca-file.
	certs := etcdtest.WriteTLSFiles(t, t.TempDir())
	for i, c := range apiserverCases {
		t.Run(c.file, func(t *testing.T) {
			got, out := realLoaded(t, bin, etcd.Endpoint, fmt.Sprintf("/registry-%d", i), filepath.Join("testdata", "apiserver", c.file), certs)
			t.Logf("%s: kube-apiserver served %d keys %v", c.file, len(got), got)
			if len(got) != c.loaded {
				t.Errorf("real apiserver loaded %d keys from %s, table says %d; output:\n%.3000s", len(got), c.file, c.loaded, out)
			}
			// And they are the keys the mirror names, in order.
			var want []string
			for _, k := range APIServerKeys(readCase(t, c.file)) {
				id, err := KeyID(k.Public)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, id)
			}
			if fmt.Sprint(want) != fmt.Sprint(got) {
				t.Errorf("real apiserver served key IDs %v, APIServerKeys says %v", got, want)
			}
		})
	}
}

// realLoaded runs kube-apiserver with keyFile and returns the key IDs its
// JWKS serves, or none when it exits (no usable key).
func realLoaded(t *testing.T, bin, etcdURL, prefix, keyFile string, certs *etcdtest.TLSFiles) ([]string, string) {
	t.Helper()
	abs, err := filepath.Abs(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	signing, _ := filepath.Abs(filepath.Join("testdata", "apiserver", "rsa-signing.key"))
	port := etcdtest.FreePort(t)
	var out bytes.Buffer
	cmd := exec.Command(bin,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		"--etcd-servers="+etcdURL, "--etcd-prefix="+prefix, "--cert-dir="+t.TempDir(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-signing-key-file="+signing, "--service-account-key-file="+abs,
		"--client-ca-file="+certs.CA, "--authorization-mode=AlwaysAllow", "--service-cluster-ip-range=10.96.0.0/12",
		"--endpoint-reconciler-type=none")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-done }()
	tc, err := certs.ClientTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	tc.RootCAs, tc.InsecureSkipVerify = nil, true // the serving certificate is self-signed in --cert-dir
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	url := fmt.Sprintf("https://127.0.0.1:%d/openid/v1/jwks", port)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var last string
	for {
		kids, ok, why := jwksKeys(hc, url)
		if ok {
			return kids, out.String()
		}
		last = why
		select {
		case <-done:
			return nil, out.String()
		case <-ctx.Done():
			t.Fatalf("kube-apiserver neither served its JWKS nor exited (last answer: %s); output:\n%.3000s", last, out.String())
		case <-time.After(200 * time.Millisecond): // it has no readiness signal but answering
		}
	}
}

func jwksKeys(hc *http.Client, url string) ([]string, bool, string) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, false, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return nil, false, resp.Status + " " + string(b)
	}
	var jwks struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jwks); err != nil {
		return nil, false, err.Error()
	}
	var kids []string
	for _, k := range jwks.Keys {
		kids = append(kids, k.Kid)
	}
	return kids, true, ""
}
