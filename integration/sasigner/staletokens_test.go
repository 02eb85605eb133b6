package sasigner

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/toolbin"
)

// The stale-token sampler's parser reads a real kube-apiserver's /metrics
// (the exposition text, with every other family in it): the counter is
// reported as present with its value or as absent, and the process start
// time is read. A real apiserver moves the counter only an hour after a
// token's issue, so the counting itself is tested on a stand-in
// (saferestart's TestRetireKeysWeighsStaleTokens); this pins the text.
func TestRealAPIServerMetricsParse(t *testing.T) {
	bin := toolbin.Kube(t, "kube-apiserver")
	e := etcdtest.Start(t)
	certs := etcdtest.WriteTLSFiles(t, t.TempDir())
	key := newSAKey(t, "ecdsa")
	dir := shortDir(t)
	keyFile, pub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	key.write(t, keyFile)
	if err := os.WriteFile(pub, []byte(key.pub), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAPIServerFlags(t, bin, e.Endpoint, certs, "--service-account-key-file="+pub, "--service-account-signing-key-file="+keyFile)
	resp, err := insecureClient(certs).Get(a.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: HTTP %d, %v", resp.StatusCode, err)
	}
	s, err := staletokens.Parse(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the parser refuses the real /metrics text: %v", err)
	}
	declared := bytes.Contains(body, []byte("# TYPE "+staletokens.CounterMetric+" counter"))
	// The parser's testdata (internal/staletokens/testdata) is an excerpt
	// of this text: STALETOKENS_DUMP=FILE writes it whole.
	if p := os.Getenv("STALETOKENS_DUMP"); p != "" {
		_ = os.WriteFile(p, body, 0o644)
	}
	t.Logf("real /metrics: %d bytes; %s declared %v, sample %+v", len(body), staletokens.CounterMetric, declared, s)
	if s.Present != declared {
		t.Errorf("counter present %v, but the text declares it: %v", s.Present, declared)
	}
	if s.Present && s.Value != 0 {
		t.Errorf("no token was ever used stale on a fresh apiserver, counter %v", s.Value)
	}
	if s.StartTime.IsZero() {
		t.Errorf("%s not read from the real text", staletokens.StartTimeMetric)
	}
}
