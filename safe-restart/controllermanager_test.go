package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
)

// writeKey writes a new private key file.
func writeKey(t *testing.T, dir, name string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pemData := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pemData, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
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
		o, _, err := parseArgs([]string{"rotate-key", "--signing-key", signing, "--controller-manager-flags-file", flagsFile,
			"--controller-manager-health-url", srv.URL + "/healthz", "--health-settle", "10ms", "--health-interval", "5ms", "--health-timeout", "2s"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		a := &app{o: o, stdout: &logs, stderr: &logs, log: log}
		err = a.restartControllerManager(context.Background(), log)
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
		var ce *codeError
		if !errors.As(err, &ce) || ce.code != exitHealth {
			t.Fatalf("err %v, want exit %d", err, exitHealth)
		}
	})
}
