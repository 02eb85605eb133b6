package restartcmd

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// parse is a command line of o's flags, checked, with s the shared flags
// (--endpoints defaults to a local etcd).
func parse(t *testing.T, s *cmdkit.Shared, o interface{ Validate(*cmdkit.Shared) []error }, args ...string) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	s.Etcd.Register(fs)
	cmdkit.Register(fs, o)
	if !strings.Contains(strings.Join(args, " "), "--endpoints") {
		args = append([]string{"--endpoints", "127.0.0.1:2379"}, args...)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if errs := o.Validate(s); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// writeKey writes a new private key file.
func writeKey(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, keytest.PKCS8PEM(t, keytest.EC(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// keyID is the key ID of the private key file at path.
func keyID(t *testing.T, path string) string {
	t.Helper()
	kids, err := trust.FileKeyIDs(path)
	if err != nil || len(kids) != 1 {
		t.Fatalf("%s: %v %v", path, kids, err)
	}
	return kids[0]
}

// pubOf is the PEM public key of the private key file at path.
func pubOf(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return keytest.PublicPEM(t, k.(*ecdsa.PrivateKey).Public())
}

// After a rotation, kube-controller-manager is restarted when its flags name
// a file holding the rotated key (whatever its path), then its /healthz
// (self-signed: not verified without a CA) must answer; otherwise not.
func TestRestartControllerManager(t *testing.T) {
	dir := t.TempDir()
	signing := writeKey(t, dir, "sa.key")
	data, _ := os.ReadFile(signing)
	sameKeyElsewhere := filepath.Join(dir, "cm-sa.key")
	if err := os.WriteFile(sameKeyElsewhere, data, 0o600); err != nil {
		t.Fatal(err)
	}
	other := writeKey(t, dir, "other.key")
	bin := filepath.Join(dir, "bin")
	calls := filepath.Join(dir, "calls")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>"+calls+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	var healthy atomic.Bool
	var probes atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		if r.URL.Path != "/healthz" || !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	flags := func(key string) string {
		p := filepath.Join(dir, "kcm-"+filepath.Base(key)+".env")
		body := "KUBE_CONTROLLER_MANAGER_ARGS=\"--kubeconfig=/etc/kubernetes/controller-manager.conf --service-account-private-key-file=" + key + "\"\n"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(t *testing.T, flagsFile string) error {
		t.Helper()
		_ = os.Remove(calls)
		o, s := &Command{}, &cmdkit.Shared{}
		parse(t, s, o, "--signing-key", signing, "--controller-manager-flags-file", flagsFile,
			"--controller-manager-health-url", srv.URL+"/healthz", "--health-settle", "10ms", "--health-interval", "5ms", "--health-timeout", "2s")
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		err := (&Step{Env: cmdkit.NewEnv(s, o.HostName, &logs, &logs, log), Opts: &o.Restarting}).restartControllerManager(context.Background(), log)
		t.Log(logs.String())
		return err
	}
	t.Run("same key at another path: restarted, healthz awaited", func(t *testing.T) {
		healthy.Store(true)
		if err := run(t, flags(sameKeyElsewhere)); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(calls)
		if string(got) != "restart kube-controller-manager.service\n" || probes.Load() == 0 {
			t.Errorf("systemctl calls %q, %d probes", got, probes.Load())
		}
	})
	t.Run("another key: not restarted", func(t *testing.T) {
		if err := run(t, flags(other)); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(calls); err == nil {
			t.Error("restarted a controller-manager that signs with another key")
		}
	})
	t.Run("not healthy: exit 7", func(t *testing.T) {
		healthy.Store(false)
		err := run(t, flags(sameKeyElsewhere))
		var ce *cmdkit.CodeError
		if !errors.As(err, &ce) || ce.Code != cmdkit.ExitHealth {
			t.Fatalf("err %v, want exit %d", err, cmdkit.ExitHealth)
		}
	})
}

// The trust record names the key kube-controller-manager signs with when
// --controller-manager-flags-file names its --service-account-private-key-file;
// without the flag it names none.
func TestTrustRecordNamesControllerManagerKey(t *testing.T) {
	dir := t.TempDir()
	apiKey := writeKey(t, dir, "sa.key")
	cmKey := writeKey(t, dir, "cm.key")
	pub := filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(pub, pubOf(t, apiKey), 0o644); err != nil {
		t.Fatal(err)
	}
	apiFlags := filepath.Join(dir, "apiserver.env")
	if err := os.WriteFile(apiFlags, []byte("KUBE_APISERVER_SA_ARGS=\"--service-account-key-file="+pub+" --service-account-signing-key-file="+apiKey+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmFlags := filepath.Join(dir, "kcm.env")
	if err := os.WriteFile(cmFlags, []byte("KUBE_CONTROLLER_MANAGER_ARGS=\"--service-account-private-key-file="+cmKey+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"with the flag", []string{"--controller-manager-flags-file", cmFlags}, keyID(t, cmKey)},
		{"without", nil, ""},
	} {
		o, s := &Command{}, &cmdkit.Shared{}
		parse(t, s, o, append([]string{"--host", "m1", "--preflight-flags-file", apiFlags}, tt.args...)...)
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		rec := TrustSnapshot(context.Background(), cmdkit.NewEnv(s, o.HostName, &logs, &logs, log), o.Preflight, o.CMFlagsFiles, log)
		if rec == nil || rec.Signing != keyID(t, apiKey) || rec.ControllerManagerSigning != tt.want {
			t.Errorf("%s: record %+v, want controller-manager key %q\n%s", tt.name, rec, tt.want, logs.String())
		}
	}
}
