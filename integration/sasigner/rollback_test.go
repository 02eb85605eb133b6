package sasigner

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	externaljwtv1 "k8s.io/externaljwt/apis/v1"

	"github.com/keysync/confd/internal/etcdtest"
)

// TestRollbackDuringBarrier, without an apiserver (a goroutine fetching
// the keys plays m1's): `rotate-key --signer` installs the next key and
// reloads the signer, whose barrier waits for m2 (a host with a trust
// record that lists only the old key); rotate-key gives up on its
// --trust-timeout, and `rotate-key --rollback` puts the old key back in
// the file and reloads the signer. The signer cancels its pending switch:
// once m2 lists the next key too, the old key still signs, as the file
// holds it.
func TestRollbackDuringBarrier(t *testing.T) {
	e := etcdtest.Start(t)
	dir := shortDir(t)
	old := newSAKey(t, "ecdsa")
	keyFile, pubFile := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	old.write(t, keyFile)
	if err := os.WriteFile(pubFile, []byte(old.pub), 0o644); err != nil {
		t.Fatal(err)
	}
	e.Put(t, keysPrefix+"m1", old.pub)
	record := func(host string, kids ...string) {
		b, _ := json.Marshal(map[string]any{"host": host, "trusted": kids, "time": time.Now()})
		e.Put(t, trustPrefix+host, string(b))
	}
	// m2 publishes no key: rotate-key's wait for the publishers does not
	// wait for it; the signer's barrier, among the recorded hosts, does.
	record("m2", old.kid)

	s := startSigner(t, signerArgs(dir, e.Endpoint, keyFile, "--host=m1", "--trust-timeout=3m")...)
	s.out.waitFor(t, "every recorded host's apiserver fetched this host's key: signing", 20*time.Second)
	// m1's apiserver, fetching every half second.
	cli := s.client(t)
	ctx, stop := context.WithCancel(context.Background())
	fetched := make(chan struct{})
	go func() {
		defer close(fetched)
		for ctx.Err() == nil {
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = cli.FetchKeys(fctx, &externaljwtv1.FetchKeysRequest{})
			cancel()
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stop(); <-fetched })

	kcm := newControllerManagerStandIn(t, keyFile)
	rotate := func(extra ...string) (string, error) {
		args := append([]string{"rotate-key", "--signer", "--host=m1", "--endpoints=" + e.Endpoint, "--config=",
			"--signing-key=" + keyFile, "--public-key=" + pubFile, "--algorithm=ecdsa-p256", "--timeout=1m", "--grace=0",
			"--log-format=json", "--controller-manager-flags-file=" + kcm.flagsFile, "--controller-manager-health-url=" + kcm.healthURL}, extra...)
		return runRotateEnv(t, kcm.env, append(args, "--", "kill", "-HUP", strconv.Itoa(s.cmd.Process.Pid))...)
	}
	out, err := rotate("--trust-timeout=3s")
	if err == nil {
		t.Fatalf("rotate-key passed while m2's record lacks the next key:\n%s", out)
	}
	next := fileKid(t, keyFile)
	if next == old.kid {
		t.Fatalf("rotate-key did not install a next key (%v):\n%s", err, out)
	}
	s.out.waitFor(t, "new signing key served", 10*time.Second)
	if kid := signKid(t, s); kid != old.kid {
		t.Fatalf("signing with %s during the barrier, want the previous %s", kid, old.kid)
	}

	out, err = rotate("--rollback", "--trust-timeout=30s")
	if err != nil {
		t.Fatalf("rotate-key --rollback: %v\n%s\nsigner:\n%s", err, out, s.out.String())
	}
	if got := fileKid(t, keyFile); got != old.kid {
		t.Fatalf("after the rollback the file holds %s, want %s", got, old.kid)
	}
	s.out.waitFor(t, "switch to "+next+" cancelled", 10*time.Second)

	// m2 fetches the next key after all: a barrier still waiting passes
	// within a watch round trip.
	record("m2", old.kid, next)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if kid := signKid(t, s); kid != old.kid {
			t.Fatalf("signing with %s, which the key file no longer holds; want %s\nsigner:\n%s", kid, old.kid, s.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(s.out.String(), "fetched the new key: signing with it") {
		t.Fatalf("the barrier switched to the rolled-back key:\n%s", s.out.String())
	}
}
