package tlsconf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

func TestClient(t *testing.T) {
	dir := t.TempDir()
	ca := etcdtest.NewCA(t, "tlsconf CA")
	cert, key := ca.Issue(t, "client", false, time.Now().Add(time.Hour))
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile, certFile, keyFile := write("ca.pem", ca.PEM), write("c.pem", cert), write("k.pem", key)
	garbage := write("garbage.pem", []byte("not pem"))

	tc, err := Client(caFile, certFile, keyFile)
	if err != nil || tc.RootCAs == nil || len(tc.Certificates) != 1 {
		t.Fatalf("Client = %+v, %v", tc, err)
	}
	if tc, err := Client("", "", ""); err != nil || tc.RootCAs != nil || len(tc.Certificates) != 0 {
		t.Fatalf("empty Client = %+v, %v", tc, err)
	}
	for _, tc := range []struct {
		name              string
		ca, cert, key     string
		want              string
		wantNoCertificate bool
	}{
		{"garbage CA", garbage, "", "", garbage, true},
		{"missing CA", filepath.Join(dir, "nope.pem"), "", "", "nope.pem", false},
		{"cert without key", "", certFile, "", certFile, false},
		{"mismatched pair", "", certFile, caFile, caFile, false},
	} {
		_, err := Client(tc.ca, tc.cert, tc.key)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrNoCertificate) != tc.wantNoCertificate {
			t.Errorf("%s: err = %v, want it to name %s", tc.name, err, tc.want)
		}
	}
}
