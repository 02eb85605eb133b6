//go:build rehearsal

package rehearsal

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/pemcheck"
)

// valueKids lists the key IDs of a published value: public keys and
// certificates (whose key kube-apiserver trusts).
func valueKids(data []byte) []string {
	var kids []string
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return kids
		}
		switch b.Type {
		case "PUBLIC KEY":
			kids = append(kids, kidOf(b.Bytes))
		case "CERTIFICATE":
			if c, err := x509.ParseCertificate(b.Bytes); err == nil {
				if der, err := x509.MarshalPKIXPublicKey(c.PublicKey); err == nil {
					kids = append(kids, kidOf(der))
				}
			}
		}
	}
}

// saCertificate is the cluster CA's certificate for a service-account key
// (PKCS#1 PEM), as a site's PKI (cfssl, Vault) issues one.
func (ca *clusterCA) saCertificate(t *testing.T, name string, keyPEM []byte) []byte {
	t.Helper()
	// Any key rotate-key may have installed (PKCS#1, PKCS#8, SEC 1).
	k, err := pemcheck.Parse("sa.key", keyPEM)
	if err != nil || len(k.Blocks) != 1 || k.Blocks[0].Public == nil {
		t.Fatalf("sa.key: %v", err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name + " service accounts"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, k.Blocks[0].Public, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// caCertificates: the masters publish CA-issued service-account
// certificates, as the deployment this project replaces did (the site's
// safe-restart.toml names the certificate; the publisher unit, restarted
// for the new configuration, publishes it). Same keys: the bundles do not
// change, nothing restarts. Then m1's PKI renews its certificate with a
// new key and restarts the publisher unit: the previous certificate stays published
// beside the new one, every master loads both, and the trust gate holds
// m1's restart until every other master trusts the new key; a client
// requesting and presenting tokens everywhere meets no refusal. After the
// grace, retire-keys withdraws the previous certificate everywhere.
func (f *fleet) caCertificates(t *testing.T) {
	m1 := f.hosts[0]
	probe := f.startTokenProbe(t)
	defer probe.finish(t)

	const crt = "/etc/kubernetes/pki/sa.crt"
	before := f.restarts()
	for _, h := range f.hosts {
		cert := f.ca.saCertificate(t, h.name, h.sa.private)
		h.write(crt, string(cert), 0o644)
		cfg := string(h.read(configPath))
		h.write(configPath, cfg+"\n# The site's PKI issues a certificate for sa.key.\ncertificate = \""+h.Path(crt)+"\"\ngrace = \"30s\"\n", 0o644)
		// A changed configuration: restarted, as Puppet does (ready once
		// it published).
		h.unitCtl(t, "restart", publisherUnit)
		if got := f.etcdKeys(t, keyPrefix)[keyPrefix+h.name]; got != string(cert) {
			t.Fatalf("%s: published %q, want its certificate", h.name, got)
		}
	}
	f.awaitConverged(t, 2*time.Minute)
	if got := f.restarts(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("publishing certificates of the same keys restarted apiservers: %v -> %v", before, got)
	}

	// m1's PKI renews with a new key pair, then notifies the helper.
	old := m1.sa.kid
	next := newSAKey(t)
	gated := make(chan string, 1)
	m1.systemd.onNextRestart(func(phase string, _ int, _ net.Conn) {
		if phase != "starting" {
			return
		}
		var why []string
		for _, o := range f.hosts[1:] {
			var rec struct {
				Trusted []string `json:"trusted"`
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := f.cli.Get(ctx, "/kubernetes/service-account-keys-trust/"+o.name)
			cancel()
			if err == nil && len(resp.Kvs) == 1 {
				err = json.Unmarshal(resp.Kvs[0].Value, &rec)
			}
			if err != nil || !slices.Contains(rec.Trusted, next.kid) {
				why = append(why, fmt.Sprintf("%s trusts %v (%v)", o.name, rec.Trusted, err))
			}
		}
		gated <- strings.Join(why, "; ")
	})
	m1.write("/etc/kubernetes/pki/sa.key", string(next.private), 0o600)
	m1.write("/etc/kubernetes/pki/sa.pub", string(next.public), 0o644)
	m1.write(crt, string(f.ca.saCertificate(t, m1.name, next.private)), 0o644)
	m1.sa = next
	// The running publisher notices the files within seconds; a restart
	// answers once it published them.
	m1.unitCtl(t, "restart", publisherUnit)
	if kids := valueKids([]byte(f.etcdKeys(t, keyPrefix)[keyPrefix+m1.name])); !slices.Contains(kids, old) || !slices.Contains(kids, next.kid) {
		t.Fatalf("m1 publishes %v after the renewal, want the previous key %s beside the new %s", kids, old, next.kid)
	}
	f.await(t, 6*time.Minute, "m1's apiserver restarted onto its new key", func() bool {
		select {
		case why := <-gated:
			if why != "" {
				t.Errorf("m1's apiserver restarted with its new key %s before every other master trusted it: %s", next.kid, why)
			}
			return true
		default:
			return false
		}
	})
	f.awaitConverged(t, 4*time.Minute)
	f.await(t, time.Minute, "a token signed with m1's new key accepted everywhere", func() bool { return probe.acceptedEverywhere(m1.name, next.kid) })

	// After the grace, retire-keys (the timer's unit) withdraws the
	// previous certificate; every master drops its key.
	var kept struct {
		Superseded map[string]struct {
			RetireAfter time.Time `json:"retire_after"`
		} `json:"superseded"`
	}
	keptKey := "/kubernetes/service-account-keys-rotation/" + m1.name + "/kept"
	if err := json.Unmarshal([]byte(f.etcdKeys(t, keptKey)[keptKey]), &kept); err != nil || kept.Superseded[old].RetireAfter.IsZero() {
		t.Fatalf("kept record %v: %+v", err, kept)
	}
	time.Sleep(time.Until(kept.Superseded[old].RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	if code, out := m1.runUnit(t, "sa-key-retire.service", nil); code != 0 {
		t.Fatalf("sa-key-retire.service exited %d:\n%s", code, out)
	}
	if slices.Contains(f.publishedKids(t), old) {
		t.Fatalf("m1's previous key %s still published after retire-keys", old)
	}
	f.awaitConverged(t, 4*time.Minute)
	// Leave the fleet as the next scenario expects it: keys published bare.
	for _, h := range f.hosts {
		cfg := string(h.read(configPath))
		cfg, _, _ = strings.Cut(cfg, "\n# The site's PKI issues a certificate for sa.key.\n")
		h.write(configPath, cfg, 0o644)
		if err := os.Remove(h.Path(crt)); err != nil {
			t.Fatal(err)
		}
	}
}
