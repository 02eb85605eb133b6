package signer

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	logtest "github.com/sirupsen/logrus/hooks/test"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
)

// Issue 34: a host published leaf.crt + ca.crt as one value and the signer
// served the CA's key, which kube-apiserver then trusted. The CA's block is
// dropped, logged with the host quoted, and the rest of the value served; a
// renewal's two leaves are both served.
func TestParsePublishedDropsCA(t *testing.T) {
	caKey, leafKey, renewedKey := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	caPEM, ca := keytest.IssuedCertPEM(t, caKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "ca"},
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign}, nil, caKey)
	tmpl := x509.Certificate{Subject: pkix.Name{CommonName: "master-1"}, KeyUsage: x509.KeyUsageDigitalSignature}
	leaf, _ := keytest.IssuedCertPEM(t, leafKey.Public(), tmpl, ca, caKey)
	renewed, _ := keytest.IssuedCertPEM(t, renewedKey.Public(), tmpl, ca, caKey)
	leafID, renewedID := keytest.KeyID(t, leafKey.Public()), keytest.KeyID(t, renewedKey.Public())
	for _, tc := range []struct {
		name  string
		value []byte
		kids  []string
		err   error
		log   []string // in the log; none: nothing logged
	}{
		{"leaf + ca.crt", append(slices.Clone(leaf), caPEM...), []string{leafID}, nil,
			[]string{`host "m1\nforged"`, "block 2 (line", "CA:TRUE", "not served", `key="/keys/m1\nforged"`}},
		{"ca.crt + leaf", append(slices.Clone(caPEM), leaf...), []string{leafID}, nil, []string{"block 1 (line 1, CERTIFICATE)"}},
		{"a renewal's two leaves", append(slices.Clone(leaf), renewed...), []string{leafID, renewedID}, nil, nil},
		{"the CA's bare key beside its leaf", append(slices.Clone(leaf), keytest.PublicPEM(t, caKey.Public())...), []string{leafID}, nil,
			[]string{"PUBLIC KEY", "signed the certificate of block 1"}},
		{"CA alone", caPEM, nil, pemcheck.ErrCA, nil},
		{"the CA's private key", append(slices.Clone(leaf), keytest.SEC1PEM(t, caKey)...), nil, pemcheck.ErrPrivateKey, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, hook := logtest.NewNullLogger()
			f := &Follower{Prefix: "/keys/", Keys: NewKeySet(nil, nil), Log: l, Metrics: NewMetrics(), bad: map[string]int64{}}
			logged := func() string {
				var b strings.Builder
				for _, e := range hook.AllEntries() {
					fmt.Fprintf(&b, "%s key=%v\n", e.Message, e.Data["key"])
				}
				return b.String()
			}
			hosts := map[string][]Key{}
			f.put(hosts, &mvccpb.KeyValue{Key: []byte("/keys/m1\nforged"), Value: tc.value, ModRevision: 1}, false)
			served := hosts["m1\nforged"]
			ok := served != nil // accepted: the host's keys are served
			if tc.err != nil {
				_, err := ParsePublished("/keys/m1", tc.value, "", nil)
				if ok || !errors.Is(err, tc.err) || !strings.Contains(err.Error(), "/keys/m1") {
					t.Fatalf("accepted %v, err %v; want %v", ok, err, tc.err)
				}
				if strings.Contains(logged(), "not served") {
					t.Errorf("a refused value is logged as a drop: %s", logged())
				}
				return
			}
			if !ok {
				t.Fatalf("refused: %s", logged())
			}
			var got []string
			for _, k := range served {
				got = append(got, k.ID)
			}
			if !slices.Equal(got, tc.kids) {
				t.Errorf("served %v, want %v", got, tc.kids)
			}
			out := logged()
			// Quoted: the host name cannot start a line of its own.
			if len(tc.log) > 0 && strings.Count(out, "\n") != 1 {
				t.Errorf("one drop, not one line: %q", out)
			}
			if len(tc.log) == 0 && out != "" {
				t.Errorf("logged: %s", out)
			}
			for _, s := range tc.log {
				if !strings.Contains(out, s) {
					t.Errorf("log %q does not contain %q", out, s)
				}
			}
		})
	}
}
