package trust

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
)

// Issue 34: `trust` warns, and exits as before, about an RSA key under
// 2048 bits a host publishes (point 8: it signs live tokens, refusing it at
// once would refuse them), and about a certificate authority's key in a
// published value, which is not counted as published: the bundle and the
// signer do not serve it (point 2), so no host is stale for not trusting it.
func TestReportWarnsWeakKeyAndCA(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	weak := keytest.RSA(t, 1024)
	caKey, leafKey := keytest.EC(t), keytest.EC(t)
	caPEM, ca := keytest.IssuedCertPEM(t, caKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "ca"},
		BasicConstraintsValid: true, IsCA: true}, nil, caKey)
	leafPEM, _ := keytest.IssuedCertPEM(t, leafKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "m2"}}, ca, caKey)
	weakID, leafID, caID := keytest.KeyID(t, weak.Public()), keytest.KeyID(t, leafKey.Public()), keytest.KeyID(t, caKey.Public())
	srv.Put(t, "/k/m1", string(keytest.PublicPEM(t, weak.Public())))
	srv.Put(t, "/k/m2", string(leafPEM)+string(caPEM))
	ctx := context.Background()
	for _, h := range []string{"m1", "m2"} {
		if err := Put(ctx, cli, "/k-trust", "", Record{Host: h, Trusted: []string{weakID, leafID}, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := Collect(ctx, cli, Prefixes{Keys: "/k", Trust: "/k-trust"})
	if err != nil {
		t.Fatal(err)
	}
	if stale := rep.Stale(); len(stale) != 0 {
		t.Errorf("stale %v: the CA's key %s counted as published", stale, caID)
	}
	if got := rep.Hosts[1].Publishes; !slices.Equal(got, []string{leafID}) {
		t.Errorf("m2 publishes %v, want the leaf's %s alone", got, leafID)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stale hosts: none\n",
		"warning: m1: /k/m1: block 1 (line 1, PUBLIC KEY): RSA key under 2048 bits: 1024 bits",
		fmt.Sprintf(`warning: m2: /k/m2 block 2 (line %d, CERTIFICATE): certificate authority's key where a service-account key belongs: "CN=ca" has basic constraints CA:TRUE: not served`, bytes.Count(leafPEM, []byte("\n"))+1),
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Hosts[0].Warnings) != 1 || len(back.Hosts[1].Warnings) != 1 {
		t.Errorf("JSON warnings: %v %+v", err, back.Hosts)
	}
}
