//go:build rehearsal

package rehearsal

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// kubeadmHost is a master moved to examples/kubeadm: its kubelet stand-in
// and how to stop it.
type kubeadmHost struct {
	kubelet     *kubelet
	stopKubelet func()
}

// toKubeadm makes every master a kubeadm master as docs/kubeadm.md installs
// one: examples/kubeadm's confdir, safe-restart.toml (static-pod mode, the
// fleet check's kubeconfig), confd.service and sa-signing-key.service (run:
// it links sa-signing.key), the static pods' manifests and admin.conf, no
// kube-apiserver.service.d drop-in or kube-apiserver-safe-restart.service,
// and a kubelet that runs the apiserver's container. The stand-in systemd's
// kube-apiserver.service is that container: it runs the manifest's
// command. The running apiservers load the same keys from the new flags
// (sa-signing.key links sa.key), so nothing restarts. The returned func
// puts the binary master's files back (for the next scenario), again
// without a restart.
func (f *fleet) toKubeadm(t *testing.T) ([]*kubeadmHost, func()) {
	t.Helper()
	ex := filepath.Join(etcdtest.RepoRoot(), "examples")
	var undo []func()
	var hosts []*kubeadmHost
	for _, h := range f.hosts {
		saved := h.snapshot(t, "/etc/confd", "/etc/systemd/system", configPath)
		h.stopConfd(t)
		for _, gone := range []string{"/etc/confd", "/etc/systemd/system/kube-apiserver.service.d", "/etc/systemd/system/kube-apiserver-safe-restart.service"} {
			if err := os.RemoveAll(h.Path(gone)); err != nil {
				t.Fatal(err)
			}
		}
		files := map[string]string{
			"/etc/confd/confd.toml":                   "kubeadm/confd/confd.toml",
			"/etc/confd/conf.d/20-sa-bundle.toml":     "kubeadm/confd/conf.d/20-sa-bundle.toml",
			"/etc/confd/templates/sa-bundle.pem.tmpl": "kubeadm/confd/templates/sa-bundle.pem.tmpl",
			configPath:                                   "kubeadm/safe-restart.toml",
			"/etc/systemd/system/confd.service":          "kubeadm/systemd/confd.service",
			"/etc/systemd/system/sa-signing-key.service": "kubeadm/systemd/sa-signing-key.service",
		}
		for dst, src := range files {
			data, err := os.ReadFile(filepath.Join(ex, src))
			if err != nil {
				t.Fatal(err)
			}
			h.write(dst, h.Rewrite(string(data)), 0o644)
		}
		// The flags kubeadm-config.yaml gives the apiserver.
		sa := []string{"--service-account-key-file=/etc/kubernetes/pki/sa-bundle.pem", "--service-account-signing-key-file=/etc/kubernetes/pki/sa-signing.key"}
		manifest := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n  namespace: kube-system\nspec:\n  containers:\n  - name: kube-apiserver\n    command:\n    - kube-apiserver\n"
		for _, a := range append(apiserverArgs(h.port, exampleEtcdURL), sa...) {
			manifest += "    - " + a + "\n"
		}
		h.write("/etc/kubernetes/manifests/kube-apiserver.yaml", h.Rewrite(manifest), 0o600)
		h.write("/etc/kubernetes/manifests/kube-controller-manager.yaml", h.Rewrite("apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-controller-manager\n  namespace: kube-system\nspec:\n  containers:\n  - name: kube-controller-manager\n    command:\n    - kube-controller-manager\n    - --service-account-private-key-file=/etc/kubernetes/pki/sa.key\n"), 0o600)
		h.write("/etc/systemd/system/kube-apiserver.service", h.Rewrite("[Service]\nEnvironmentFile=/etc/kubernetes/apiserver.env\nExecStart=/usr/local/bin/kube-apiserver $KUBE_APISERVER_ARGS "+strings.Join(sa, " ")+"\n"), 0o644)
		h.writeKubeconfig()
		if code, out := h.oneshot(t, "sa-signing-key.service").run(); code != 0 {
			t.Fatalf("%s: sa-signing-key.service exited %d:\n%s", h.name, code, out)
		}
		k := startKubelet(t, h, 2*time.Second)
		kh := &kubeadmHost{kubelet: k, stopKubelet: k.supervise()}
		hosts = append(hosts, kh)
		h.startConfd(t)
		undo = append(undo, func() {
			h.stopConfd(t)
			kh.stopKubelet()
			for _, gone := range []string{"/etc/confd", "/etc/systemd/system", "/etc/kubernetes/manifests"} {
				if err := os.RemoveAll(h.Path(gone)); err != nil {
					t.Error(err)
				}
			}
			h.restore(t, saved)
			h.startConfd(t)
		})
	}
	f.awaitConverged(t, 2*time.Minute)
	return hosts, func() {
		for _, u := range undo {
			u()
		}
		f.awaitConverged(t, 2*time.Minute)
	}
}

// fileCopy is a file's content and mode.
type fileCopy struct {
	data []byte
	mode fs.FileMode
}

// snapshot copies the files under the given host paths (files or
// directories), for restore.
func (h *host) snapshot(t *testing.T, paths ...string) map[string]fileCopy {
	t.Helper()
	out := map[string]fileCopy{}
	for _, p := range paths {
		err := filepath.WalkDir(h.Path(p), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			data, err := os.ReadFile(path)
			out[strings.TrimPrefix(path, h.Root)] = fileCopy{data, info.Mode().Perm()}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func (h *host) restore(t *testing.T, files map[string]fileCopy) {
	t.Helper()
	for p, c := range files {
		h.write(p, string(c.data), c.mode)
	}
}

// kubeadmReimage: on kubeadm masters (toKubeadm) with the fleet check on,
// m2 is reimaged: a new key pair, no rendered bundle, no sa-signing.key
// link; its kubelet runs the apiserver's static pod, whose container exits
// until the link exists; its units start as at boot (sa-key-publish,
// confd.service, and sa-signing-key late, once m1's fleet check waits).
// With no other command the reimage completes: m1 and m3 each restart once
// to trust m2's new key, their fleet check leaving m2 out (its waiting
// record, read again while the check waits) instead of refusing; m2's
// apiserver then starts and signs with its new key. A token m2 signed before
// the reimage is accepted by every apiserver throughout, m2's own included;
// after the grace the shipped sa-key-retire.service on m3 retires the lost
// key and that token is refused everywhere. Tokens of the current keys are
// accepted 9 of 9 throughout.
func (f *fleet) kubeadmReimage(t *testing.T) {
	m1, m2, m3 := f.hosts[0], f.hosts[1], f.hosts[2]
	kh, undo := f.toKubeadm(t)
	defer undo()
	anon := httpClient(t, f.ca.pem, nil, nil)
	f.ensureServiceAccount(t) // when run right after fresh
	var oldToken string
	f.await(t, time.Minute, "a token signed by m2 before its reimage", func() bool {
		tok, err := f.tryToken(m2)
		oldToken = tok
		return err == nil
	})
	old := m2.sa.kid
	if got := tokenKid(oldToken); got != old {
		t.Fatalf("m2's token before the reimage carries kid %s, want %s", got, old)
	}
	oldAccepted := func() int {
		n := 0
		for _, h := range f.hosts {
			if code, err := tryReview(anon, h, oldToken); err == nil && code == http.StatusCreated {
				n++
			}
		}
		return n
	}
	probe := f.startTokenProbe(t)
	defer probe.finish(t)
	failed := map[string]int{}
	for _, h := range f.hosts {
		failed[h.name] = h.confd.out.count("reload_cmd failed")
	}
	before := f.restarts()

	// Reinstalled: the machine goes down (kubelet, its container, confd),
	// comes back with a new key pair and without what confd rendered or
	// sa-signing-key.service linked.
	f.tl.outOfService(m2.name)
	m2.stopConfd(t)
	m2.unitCtl(t, "stop", publisherUnit)
	kh[1].stopKubelet()
	m2.systemd.stopUnit()
	// A new disk: the publisher's state (the tombstones it saw) is gone.
	if err := os.RemoveAll(m2.Path("/var/lib/kube-apiserver-safe-restart")); err != nil {
		t.Fatal(err)
	}
	m2.sa = newSAKey(t)
	m2.write("/etc/kubernetes/pki/sa.key", string(m2.sa.private), 0o600)
	m2.write("/etc/kubernetes/pki/sa.pub", string(m2.sa.public), 0o644)
	for _, gone := range []string{"/etc/kubernetes/pki/sa-bundle.pem", "/etc/kubernetes/pki/sa-signing.key", "/etc/kubernetes/apiserver-sa.env"} {
		if err := os.Remove(m2.Path(gone)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	// The site's configuration, as the new image ships it: a grace short
	// enough for the rehearsal (undo puts the binary master's back).
	m2.write(configPath, string(m2.read(configPath))+"\n# Superseded keys stay published this long.\ngrace = \"20s\"\n", 0o644)

	// Boot, as systemd may order it: the kubelet (its apiserver container
	// exits: no bundle, no signing key), the publisher and confd.service;
	// sa-signing-key.service (After=kubelet.service) starts late, once m1's
	// restart for the new key already waits in its fleet check, counting m2
	// (a trust record, no live Lease, no waiting record yet): that check
	// must see the waiting record when it comes, not wait --fleet-timeout.
	start := time.Now()
	kh[1].stopKubelet = kh[1].kubelet.supervise()
	m2.unitCtl(t, "start", publisherUnit) // ready once it published
	m2.startConfd(t)
	if !m1.confd.out.waitFor("waiting up to --fleet-timeout", m1.confd.done, 2*time.Minute) {
		t.Fatalf("m1's restart for m2's new key never waited in its fleet check:\n%s", tail(m1.confd.out.String(), 6000))
	}
	signingKey := m2.oneshot(t, "sa-signing-key.service")
	type result struct {
		code int
		out  string
		at   time.Time
	}
	linked := make(chan result, 1)
	go func() {
		code, out := signingKey.run()
		linked <- result{code, out, time.Now()}
	}()
	var r result
	select {
	case r = <-linked:
	case <-time.After(5 * time.Minute):
		t.Fatal("m2: sa-signing-key.service still waiting after 5 min")
	}
	if r.code != 0 {
		t.Fatalf("m2: sa-signing-key.service exited %d:\n%s", r.code, r.out)
	}
	t.Logf("m2's sa-signing-key.service linked its new key %s %s after boot", m2.sa.kid, r.at.Sub(start).Round(time.Second))
	for _, o := range []*host{m1, m3} {
		var rec struct {
			Trusted []string `json:"trusted"`
		}
		key := "/kubernetes/service-account-keys-trust/" + o.name
		if err := json.Unmarshal([]byte(f.etcdKeys(t, key)[key]), &rec); err != nil || !slices.Contains(rec.Trusted, m2.sa.kid) {
			t.Errorf("m2's sa.key linked while %s trusts %v (%v), want its new key %s", o.name, rec.Trusted, err, m2.sa.kid)
		}
	}
	f.awaitConverged(t, 4*time.Minute)
	t.Logf("reimage converged %s after boot", time.Since(start).Round(time.Second))
	after := f.restarts()
	for _, o := range []*host{m1, m3} {
		i := slices.Index(f.hosts, o)
		if n := after[i] - before[i]; n != 1 {
			t.Errorf("%s restarted %d times for m2's new key, want once", o.name, n)
		}
		if n := o.confd.out.count("reload_cmd failed") - failed[o.name]; n != 0 {
			t.Errorf("%s: %d failed restarts (reload_cmd) during the reimage, want none:\n%s", o.name, n, tail(o.confd.out.String(), 6000))
		}
		if !strings.Contains(o.confd.out.String(), "waiting for this restart to trust their key: "+m2.name) {
			t.Errorf("%s's fleet check never left m2 out as waiting for its restart:\n%s", o.name, tail(o.confd.out.String(), 6000))
		}
	}
	if !slices.Contains(f.publishedKids(t), old) {
		t.Fatalf("m2's lost key %s was withdrawn by its reimage", old)
	}
	f.await(t, time.Minute, "a token signed with m2's new key accepted everywhere", func() bool { return probe.acceptedEverywhere(m2.name, m2.sa.kid) })
	n := oldAccepted()
	t.Logf("the token m2 signed before its reimage (kid %s): accepted by %d of %d apiservers after the reimage", old, n, len(f.hosts))
	if n != len(f.hosts) {
		t.Errorf("the token m2 signed before its reimage is accepted by %d of %d apiservers, want all", n, len(f.hosts))
	}

	// The reimage ends with m2's own restart by its confd (the trust gate
	// let it through once m1 and m3 trusted its key): its trust record
	// then says it signs with the new key, and retire-keys would keep a
	// key a record says is signed with.
	f.await(t, 3*time.Minute, "m2's trust record naming its new signing key", func() bool {
		var rec struct {
			Signing string `json:"signing"`
		}
		key := "/kubernetes/service-account-keys-trust/" + m2.name
		return json.Unmarshal([]byte(f.etcdKeys(t, key)[key]), &rec) == nil && rec.Signing == m2.sa.kid
	})
	f.awaitConverged(t, 4*time.Minute)

	// After the grace (the key record says until when), m3's shipped
	// retire unit retires the lost key.
	rec := f.keptRecord(t, m2)
	due, ok := rec.Superseded[old]
	if !ok {
		t.Fatalf("m2's key record does not list its lost key %s as superseded: %+v", old, rec)
	}
	time.Sleep(time.Until(due.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	if code, out := m3.oneshot(t, "sa-key-retire.service").run(); code != 0 || !strings.Contains(out, "key "+old+" retired") {
		t.Fatalf("sa-key-retire.service on m3 exited %d (want m2's key %s retired):\n%s", code, old, out)
	}
	f.awaitConverged(t, 4*time.Minute)
	n = oldAccepted()
	t.Logf("the token of m2's retired key %s: accepted by %d of %d apiservers after retire-keys", old, n, len(f.hosts))
	if n != 0 {
		t.Errorf("the token of m2's retired key is accepted by %d apiservers, want none", n)
	}
	f.assertAllTokensAccepted(t)
}
