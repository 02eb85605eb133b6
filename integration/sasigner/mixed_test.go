package sasigner

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/toolbin"
)

// TestMixedFleet: a fleet moving to the signer one master at a time. m1
// still runs in bundle mode (--service-account-key-file with every
// published key, as confd renders it, and its own signing key file); m2
// and m3 run on their signers. Every token verifies on every master: 9/9.
func TestMixedFleet(t *testing.T) {
	bin := toolbin.Kube(t, "kube-apiserver")
	e := etcdtest.Start(t)
	certs := etcdtest.WriteTLSFiles(t, t.TempDir())
	admin := insecureClient(certs)

	names := []string{"m1", "m2", "m3"}
	keys := map[string]saKey{"m1": newSAKey(t, "rsa"), "m2": newSAKey(t, "ecdsa"), "m3": newSAKey(t, "rsa")}
	bundle := ""
	for _, n := range names {
		e.Put(t, keysPrefix+n, keys[n].pub)
		bundle += keys[n].pub
	}
	apis := map[string]*apiserver{}
	dir := shortDir(t)
	keyFile := filepath.Join(dir, "m1-sa.key")
	keys["m1"].write(t, keyFile)
	bundleFile := filepath.Join(dir, "sa-bundle.pem")
	if err := os.WriteFile(bundleFile, []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	apis["m1"] = startAPIServerFlags(t, bin, e.Endpoint, certs,
		"--service-account-key-file="+bundleFile, "--service-account-signing-key-file="+keyFile)
	for _, n := range names[1:] {
		d := shortDir(t)
		keys[n].write(t, filepath.Join(d, "sa.key"))
		s := startSigner(t, signerArgs(d, e.Endpoint, filepath.Join(d, "sa.key"), "--host="+n)...)
		s.out.waitFor(t, "published keys read from etcd", 20*time.Second)
		apis[n] = startAPIServer(t, bin, e.Endpoint, s.socket, certs)
	}
	ensureServiceAccount(t, admin, apis["m1"])
	accepted := 0
	for _, from := range names {
		tok := token(t, admin, apis[from])
		if kid := header(t, tok)["kid"]; kid != keys[from].kid {
			t.Errorf("%s's token has kid %s, want %s", from, kid, keys[from].kid)
		}
		for _, to := range names {
			if code := review(t, apis[to], tok); code == http.StatusCreated {
				accepted++
			} else {
				t.Errorf("%s refused %s's token: HTTP %d", to, from, code)
			}
		}
	}
	t.Logf("mixed fleet (m1 bundle, m2 and m3 signer): %d of 9 tokens accepted", accepted)
}
