//go:build rehearsal

package rehearsal

import (
	"strings"
	"testing"
	"time"
)

// etcdRestore is Kubernetes' disaster-recovery procedure after a master's
// key changed: etcd restored from a snapshot taken before m1's key was
// replaced (by hand, as a reimage does: new sa.key/sa.pub, its publisher
// publishes it, the fleet trusts it, m1 signs with it).
//
// What the operator stops: every apiserver (the procedure's first step)
// and every confd (whose reload_cmd would start an apiserver through the
// restart lock while etcd is being replaced). The publishers keep running:
// they only write this host's own keys from its disk, which is what the
// restored etcd lacks, and noticing a restore is their job. etcd is then
// restored (the snapshot restore tool of the etcd the fleet runs, a new
// data dir, the same member name and peer URL) and started again; the
// apiservers are started as systemd starts them (the wait-trusted drop-in
// first; each start records the trust of the apiserver it starts), then,
// once they run, confd. No etcdctl step.
//
// The restored etcd holds m1's old key alone and every trust record as it
// was before the change, m1's saying it signs with the old key.
func (f *fleet) etcdRestore(t *testing.T) {
	m1 := f.hosts[0]
	// Before the snapshot: the token probe's service account must be in
	// the restored store too.
	f.ensureServiceAccount(t)
	snapshot := f.etcd.Snapshot(t)
	probe := f.startTokenProbe(t)
	defer probe.finish(t)

	old := m1.sa.kid
	m1.sa = newSAKey(t)
	m1.write("/etc/kubernetes/pki/sa.key", string(m1.sa.private), 0o600)
	m1.write("/etc/kubernetes/pki/sa.pub", string(m1.sa.public), 0o644)
	f.awaitConverged(t, 4*time.Minute)
	f.await(t, time.Minute, "a token signed with m1's new key accepted everywhere", func() bool { return probe.acceptedEverywhere(m1.name, m1.sa.kid) })
	t.Logf("m1's key replaced: %s -> %s", old, m1.sa.kid)

	publog := map[string]int{}
	for _, h := range f.hosts {
		f.tl.outOfService(h.name) // the whole control plane down on purpose
		h.stopConfd(t)
		h.systemd.stopUnit()
		publog[h.name] = len(h.read("/var/log/sa-key-publish.log"))
	}
	defer func() {
		if !t.Failed() {
			return
		}
		for _, h := range f.hosts {
			var lines []string
			for _, l := range strings.Split(string(h.read("/var/log/kube-apiserver.log")), "\n") {
				if strings.Contains(l, "kube-apiserver-safe-restart[") || strings.Contains(l, "systemd:") {
					lines = append(lines, l)
				}
			}
			t.Logf("%s kube-apiserver.log, wait-trusted and systemd lines (last 10):\n%s", h.name, strings.Join(lines[max(0, len(lines)-10):], "\n"))
		}
	}()
	before := probe.count(m1.name, m1.sa.kid)
	f.etcd.RestoreSnapshot(t, snapshot)
	restored := time.Now()

	started := make(chan string, len(f.hosts))
	for _, h := range f.hosts {
		go func() {
			if err := h.systemd.restart(func(string) {}); err != nil {
				started <- h.name + ": " + err.Error()
				return
			}
			started <- ""
		}()
	}
	// confd once every apiserver runs: its check_cmd refuses a bundle that
	// lacks a key a trust record says is signed with, and the records are
	// the snapshot's until each apiserver's start rewrites its own.
	deadline := time.After(time.Minute)
	for range f.hosts {
		select {
		case why := <-started:
			if why != "" {
				t.Fatalf("apiserver start after the restore failed: %s", why)
			}
		case <-deadline:
			t.Fatalf("apiservers not all started a minute after the restore (wait-trusted still waiting?)")
		}
	}
	for _, h := range f.hosts {
		h.startConfd(t)
	}
	f.await(t, time.Minute, "m1's tokens (new key) accepted by every apiserver after the restore", func() bool {
		return probe.count(m1.name, m1.sa.kid) > before
	})
	t.Logf("m1's new key accepted everywhere %s after the restore", time.Since(restored).Round(time.Second))
	f.awaitConverged(t, 2*time.Minute)
	f.assertAllTokensAccepted(t)
	for _, h := range f.hosts {
		log := string(h.read("/var/log/sa-key-publish.log"))[publog[h.name]:]
		if h == m1 && !strings.Contains(log, "etcd restore detected") && !strings.Contains(log, "repaired") {
			t.Errorf("%s: the publisher logged neither the restore nor a repair:\n%s", h.name, tail(log, 4000))
		}
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "etcd restore detected") || strings.Contains(line, "repaired") {
				t.Logf("%s publisher: %s", h.name, line)
			}
		}
	}
}
