package keycmd

import (
	"context"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/legacytokens"
)

// legacyTokenGate runs before retire-keys retires kid: with --kubeconfig,
// it refuses (exit 3, naming namespace/name, never a token) while a legacy
// token Secret holds a token signed with that key, since every apiserver
// refuses such tokens once the key is gone. Re-creating the Secret (after
// kube-controller-manager signs with the new key) clears it.
func (r *retirer) legacyTokenGate(ctx context.Context, kid string, log logrus.FieldLogger) int {
	o := r.o
	if o.Kubeconfig == "" {
		return cmdkit.ExitOK
	}
	if o.IgnoreLegacyTokens {
		log.Warnf("--ignore-legacy-tokens: not looking for legacy token Secrets signed with %s; any left stop working once it is retired", kid)
		return cmdkit.ExitOK
	}
	l, err := legacytokens.New(o.Kubeconfig, r.Etcd.CommandTimeout)
	if err != nil {
		log.WithError(err).Error("retire-keys: legacy token check")
		return cmdkit.ExitPreflight
	}
	held, err := l.Holding(ctx, kid)
	if err != nil {
		log.WithError(err).Errorf("retire-keys: cannot list legacy token Secrets: not retiring %s (pass --ignore-legacy-tokens to retire without looking)", kid)
		return cmdkit.ExitError
	}
	if len(held) > 0 {
		log.Errorf("retire-keys refused: %d legacy token Secret(s) hold tokens signed with %s, which every apiserver would refuse once it is retired: %s. Re-create them once kube-controller-manager signs with the new key (or pass --ignore-legacy-tokens)",
			len(held), kid, strings.Join(held, ", "))
		return cmdkit.ExitPreflight
	}
	log.Infof("no legacy token Secret holds a token signed with %s", kid)
	return cmdkit.ExitOK
}

// retireGates run before retire-keys retires kid, a due superseded key of
// any host. A key any host's trust record says its apiserver signs with is
// kept, logged, exit 0: two hosts may share a key (kubeadm's upload-certs),
// and it is due only once no apiserver signs with it (a reimaged host not
// restarted yet, the shared key until the last master rotated). Today's
// refusals stay (exit 3, naming the hosts): while any host's record says
// its kube-controller-manager signs with kid (the legacy token Secrets it
// creates would be refused once the key is gone), and while a legacy token
// Secret holds a token signed with it. Records without the
// controller-manager's key (older helpers, hosts without
// --controller-manager-flags-file) block nothing. It reports whether kid
// may be retired now, and the exit code.
func (r *retirer) retireGates(ctx context.Context, kid string, recs map[string]trust.Record, log logrus.FieldLogger) (bool, int) {
	if hosts := trust.APIServersSigningWith(recs, kid); len(hosts) > 0 {
		log.Warnf("key %s is due, but the apiserver on %s signs with it (trust record): kept until no apiserver does",
			kid, strings.Join(hosts, ", "))
		return false, cmdkit.ExitOK
	}
	if hosts := trust.ControllerManagersSigningWith(recs, kid); len(hosts) > 0 {
		log.Errorf("retire-keys refused: kube-controller-manager on %s signs with %s (trust record), so the legacy token Secrets it creates would be refused once it is retired. Restart it with the new key (rotate-key --controller-manager-flags-file on that host) first",
			strings.Join(hosts, ", "), kid)
		return false, cmdkit.ExitPreflight
	}
	code := r.legacyTokenGate(ctx, kid, log)
	return code == cmdkit.ExitOK, code
}
