// Package rehearsal runs the shipped examples (confd resources, templates,
// systemd units) on several control-plane hosts sharing one machine. Each
// host gets its own root directory; the only change made to an example is
// moving its host paths under that root and pointing its well-known
// loopback addresses (etcd, the apiserver, confd's metrics) at the host's
// own ports. The fleet itself is driven by the tests in this package (build tag
// rehearsal, `make rehearsal`).
package rehearsal

import (
	"regexp"
	"strings"
)

// Host is one master's place on the shared machine.
type Host struct {
	// Root is the directory standing in for the host's "/".
	Root string
	// EtcdURL replaces the examples' etcd client URL, https://127.0.0.1:2379.
	EtcdURL string
	// APIServerURL replaces the examples' apiserver URL, https://127.0.0.1:6443.
	APIServerURL string
	// ConfdMetricsAddr replaces confd's -metrics-addr in confd.service,
	// 127.0.0.1:9095: a port of its own, taken once like the apiserver's.
	// Not 127.0.0.1:0: a confd restarted while an apiserver of the
	// machine is down could take that apiserver's port, and the apiserver
	// would then not start (the kernel hands out the same range).
	ConfdMetricsAddr string
}

// The examples' loopback addresses, each of which belongs to one host.
const (
	exampleEtcdURL      = "https://127.0.0.1:2379"
	exampleAPIServerURL = "https://127.0.0.1:6443"
	// confd's -metrics-addr in confd.service.
	exampleConfdMetricsAddr = "127.0.0.1:9095"
)

// hostPaths matches an absolute path that belongs to one host (its
// configuration, its binaries, its runtime state) where it starts a word.
// System tools every host shares (/bin/sh) and etcd keys
// (/kubernetes/...) do not match and stay as they are.
func hostPaths() *regexp.Regexp {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_./])(/etc/|/usr/local/bin/|/usr/bin/etcdctl\b|/bin/systemctl\b|/run/|/var/lib/)`)
}

// Rewrite moves every host path in text under h.Root and replaces the
// examples' loopback addresses with the host's. Nothing else changes:
// Restore gives the original text back.
func (h Host) Rewrite(text string) string {
	text = hostPaths().ReplaceAllString(text, "${1}"+escapeDollar(h.Root)+"${2}")
	r := strings.NewReplacer(exampleEtcdURL, h.EtcdURL, exampleAPIServerURL, h.APIServerURL, exampleConfdMetricsAddr, h.ConfdMetricsAddr)
	return r.Replace(text)
}

// Restore undoes Rewrite.
func (h Host) Restore(text string) string {
	r := strings.NewReplacer(h.EtcdURL, exampleEtcdURL, h.APIServerURL, exampleAPIServerURL, h.ConfdMetricsAddr, exampleConfdMetricsAddr)
	text = r.Replace(text)
	return strings.ReplaceAll(text, h.Root+"/", "/")
}

// Path is the host's file for an absolute path such as /etc/confd.
func (h Host) Path(abs string) string { return h.Root + abs }

func escapeDollar(s string) string { return strings.ReplaceAll(s, "$", "$$") }
