package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
)

// Issue 31.3: a bundle never silently drops a key a live apiserver signs
// with. master-2's key deleted from etcd by mistake while its trust record
// says its apiserver signs with it: the shipped resource's check refuses
// the bundle, naming master-2 and the key, and the live bundle stays. With
// etcd gone, the same check_cmd refuses too, naming the endpoint.
func TestExampleBundleKeepsALiveSigningKey(t *testing.T) {
	s := etcdtest.Start(t)
	dir, out, reloads := exampleConfdir(t, s.Endpoint)
	k1, k2 := keytest.EC(t), keytest.EC(t)
	kid1, kid2 := keytest.KeyID(t, &k1.PublicKey), keytest.KeyID(t, &k2.PublicKey)
	if err := os.WriteFile(filepath.Join(out, "pki", "sa.key"), keytest.PKCS8PEM(t, k1), 0o600); err != nil {
		t.Fatal(err)
	}
	const prefix = "/kubernetes/service-account-keys/"
	s.Put(t, prefix+"master-1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	s.Put(t, prefix+"master-2", string(keytest.PublicPEM(t, &k2.PublicKey)))
	cli := s.Client(t)
	ctx := context.Background()
	for host, kid := range map[string]string{"master-1": kid1, "master-2": kid2} {
		if err := trust.Put(ctx, cli, trust.DefaultPrefix, "", trust.Record{Host: host, Trusted: []string{kid1, kid2}, Signing: kid, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	args := append(nodeArgs(t, s), "-onetime", "-confdir", dir, "-resource", "20-sa-bundle")
	if r := confd(t, nil, args...); r.code != 0 {
		t.Fatalf("first render: exit %d\n%s", r.code, r.stderr)
	}
	bundle := filepath.Join(out, "pki", "sa-bundle.pem")
	live := readFile(t, bundle)
	if strings.Count(live, "BEGIN PUBLIC KEY") != 2 {
		t.Fatalf("bundle:\n%s", live)
	}

	if _, err := cli.Delete(ctx, prefix+"master-2"); err != nil {
		t.Fatal(err)
	}
	r := confd(t, nil, args...)
	if r.code == 0 || !strings.Contains(r.stderr, "master-2") || !strings.Contains(r.stderr, kid2) ||
		!strings.Contains(r.stderr, "publish-key") {
		t.Errorf("a bundle without master-2's signing key: exit %d, want a refusal naming master-2, %s and what to do\n%s", r.code, kid2, r.stderr)
	}
	if got := readFile(t, bundle); got != live {
		t.Errorf("live bundle replaced:\n%s", got)
	}
	if got := readFile(t, reloads); got != "reload\n" {
		t.Errorf("reload_cmd ran again (%q)", got)
	}

	// The record gone too (master-2 removed as docs/rotation.md says):
	// nothing signs with the key any more, and the bundle drops it.
	if _, err := cli.Delete(ctx, trust.Key(trust.DefaultPrefix, "master-2")); err != nil {
		t.Fatal(err)
	}
	if r := confd(t, nil, args...); r.code != 0 || strings.Count(readFile(t, bundle), "BEGIN PUBLIC KEY") != 1 {
		t.Errorf("master-2 removed: exit %d, bundle:\n%s\n%s", r.code, readFile(t, bundle), r.stderr)
	}

	// etcd down while confd checks a staged bundle: the shipped check_cmd,
	// run as confd runs it, refuses it.
	staged := filepath.Join(t.TempDir(), ".sa-bundle.pem.stage")
	if err := os.WriteFile(staged, []byte(live), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	cmdline := exampleCheckCmd(t, dir, staged)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := exec.CommandContext(cctx, "/bin/sh", "-c", cmdline).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("check with etcd down: %v, want a non-zero exit\n%s", err, res)
	}
	if !strings.Contains(string(res), "etcd did not answer") || !strings.Contains(string(res), s.Endpoint) {
		t.Errorf("check with etcd down: exit %d, want the message to say etcd did not answer at %s:\n%s", ee.ExitCode(), s.Endpoint, res)
	}
}

// exampleCheckCmd is the check_cmd of the copied 20-sa-bundle resource for
// staged file src.
func exampleCheckCmd(t *testing.T, dir, src string) string {
	t.Helper()
	var res struct {
		Template struct {
			CheckCmd string `toml:"check_cmd"`
		} `toml:"template"`
	}
	if _, err := toml.DecodeFile(filepath.Join(dir, "conf.d", "20-sa-bundle.toml"), &res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Template.CheckCmd, "--require-signing-keys") {
		t.Fatalf("the example's check_cmd does not check the signing keys: %s", res.Template.CheckCmd)
	}
	return regexp.MustCompile(`\{\{\s*\.src\s*\}\}`).ReplaceAllString(res.Template.CheckCmd, src)
}
