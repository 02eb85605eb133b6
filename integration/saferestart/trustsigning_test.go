package saferestart

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
)

// Issue 31.3: `trust` reports a host whose record says its apiserver signs
// with a key that no host publishes (deleted from etcd by mistake: every
// bundle rendered now drops it) as stale, exit 10, host and key named.
func TestTrustReportsAnUnpublishedSigningKey(t *testing.T) {
	s := etcdtest.Start(t)
	k1, k2 := keytest.EC(t), keytest.EC(t)
	kid1, kid2 := keytest.KeyID(t, &k1.PublicKey), keytest.KeyID(t, &k2.PublicKey)
	s.Put(t, trust.DefaultKeysPrefix+"/m1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	cli := s.Client(t)
	for host, kid := range map[string]string{"m1": kid1, "m2": kid2} {
		if err := trust.Put(context.Background(), cli, trust.DefaultPrefix, "", trust.Record{Host: host, Trusted: []string{kid1, kid2}, Signing: kid, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	p := runBin(t, env(s), "trust")
	out := p.stdout.String()
	if p.code != codeStale || !strings.Contains(out, "m2") || !strings.Contains(out, "STALE: signs with "+kid2+", which no host publishes") ||
		!strings.Contains(out, "stale hosts: m2") {
		t.Fatalf("trust: exit %d, want %d naming m2 and %s\n%s", p.code, codeStale, kid2, out)
	}
}
