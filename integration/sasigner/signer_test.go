package sasigner

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

const keysPrefix = "/kubernetes/service-account-keys/"

// TestCacheServesWhileEtcdDown: a signer restarted while etcd is down
// serves every key it served before, with the same data_timestamp (the
// apiserver sees no change), and never fewer keys.
func TestCacheServesWhileEtcdDown(t *testing.T) {
	e := etcdtest.Start(t)
	dir := shortDir(t)
	own, other := newSAKey(t, "rsa"), newSAKey(t, "ecdsa")
	keyFile := filepath.Join(dir, "sa.key")
	own.write(t, keyFile)
	e.Put(t, keysPrefix+"m1", own.pub)
	e.Put(t, keysPrefix+"m2", other.pub)

	s := startSigner(t, signerArgs(dir, e.Endpoint, keyFile)...)
	s.out.waitFor(t, "published keys read from etcd", 20*time.Second)
	before := s.fetch(t)
	want := []string{own.kid, other.kid}
	sort.Strings(want)
	if got := kids(before); !slices.Equal(got, want) {
		t.Fatalf("FetchKeys %v, want %v", got, want)
	}
	s.stop(syscall.SIGTERM)
	if _, err := os.Stat(s.socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind after SIGTERM: %v", err)
	}

	e.Stop()
	s2 := startSigner(t, signerArgs(dir, e.Endpoint, keyFile)...)
	s2.out.waitFor(t, "etcd unreachable", 20*time.Second)
	after := s2.fetch(t)
	if got := kids(after); !slices.Equal(got, want) {
		t.Fatalf("with etcd down FetchKeys %v, want the cached %v", got, want)
	}
	if !after.DataTimestamp.AsTime().Equal(before.DataTimestamp.AsTime()) {
		t.Errorf("data_timestamp %s after a restart on the cache, want %s", after.DataTimestamp.AsTime(), before.DataTimestamp.AsTime())
	}

	// etcd back: m2 withdrew its key meanwhile.
	e.Restart(t)
	if _, err := e.Client(t).Delete(context.Background(), keysPrefix+"m2"); err != nil {
		t.Fatal(err)
	}
	s2.out.waitFor(t, "etcd reachable again", 30*time.Second)
	s2.out.waitFor(t, `"msg":"key set changed"`, 10*time.Second)
	if got := kids(s2.fetch(t)); !slices.Equal(got, []string{own.kid}) {
		t.Fatalf("after etcd came back FetchKeys %v, want only %s", got, own.kid)
	}
}

// TestSIGKILLLeavesAStaleSocket: after SIGKILL the socket file stays; the
// next start replaces it, as the unit's restart does.
func TestSIGKILLLeavesAStaleSocket(t *testing.T) {
	e := etcdtest.Start(t)
	dir := shortDir(t)
	k := newSAKey(t, "ecdsa")
	keyFile := filepath.Join(dir, "sa.key")
	k.write(t, keyFile)
	s := startSigner(t, signerArgs(dir, e.Endpoint, keyFile)...)
	s.stop(syscall.SIGKILL)
	if _, err := os.Stat(s.socket); err != nil {
		t.Fatalf("no stale socket after SIGKILL (%v): the test shows nothing", err)
	}
	s2 := startSigner(t, signerArgs(dir, e.Endpoint, keyFile)...)
	if got := kids(s2.fetch(t)); !slices.Contains(got, k.kid) {
		t.Fatalf("FetchKeys %v after restart, want %s", got, k.kid)
	}
}

// TestRefusesBadFlags: the limits kube-apiserver enforces are refused at
// start, naming the flag; a bad signing key names the file.
func TestRefusesBadFlags(t *testing.T) {
	dir := shortDir(t)
	keyFile := filepath.Join(dir, "sa.key")
	newSAKey(t, "ecdsa").write(t, keyFile)
	pubFile := filepath.Join(dir, "sa.pub")
	_ = os.WriteFile(pubFile, []byte(newSAKey(t, "ecdsa").pub), 0o644)
	worldWritable := filepath.Join(dir, "tmp")
	if err := os.Mkdir(worldWritable, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(worldWritable, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--max-token-expiration=599s"}, 2, "--max-token-expiration"},
		{[]string{"--refresh-hint=0s"}, 2, "--refresh-hint"},
		{[]string{"--socket=relative.sock"}, 2, "--socket"},
		{[]string{"--signing-key=" + pubFile}, 1, pubFile},
		// Others could bind the socket's path first (issue 34 point 4).
		{[]string{"--socket=" + filepath.Join(worldWritable, "signer.sock")}, 1, worldWritable + " (owner 0:0, mode 1777) is writable by group or others"},
	} {
		args := append(signerArgs(dir, etcdtest.UnusedEndpoint(t), keyFile), tc.args...)
		out, err := runSigner(t, args...)
		code := 0
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		}
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, output %q; want exit %d naming %q", tc.args, code, out, tc.code, tc.want)
		}
	}
}
