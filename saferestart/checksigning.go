package saferestart

import (
	"context"
	"fmt"

	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// signingKeysMissing returns, for check --require-signing-keys, one error
// per FILE and key that a host's trust record says is signed with but the
// FILE lacks; an error when the records cannot be read: check cannot tell
// then, so it refuses, as the render itself fails when etcd does not answer. A bundle without such a key makes every apiserver that loads it
// refuse the tokens signed with it: the live file must stay.
func (o *checkCmd) signingKeysMissing(ctx context.Context, a *cmdkit.Env, files []string) ([]error, error) {
	cli, err := a.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd did not answer (%w): cannot read the trust records under %s, so cannot tell whether the bundle drops a key a live apiserver signs with", a.Etcd.Err(err), o.TrustPrefix)
	}
	defer cli.Close()
	rctx, cancel := a.OpCtx(ctx)
	rep, err := trust.Collect(rctx, cli, trust.Prefixes{Keys: o.KeysPrefix, Trust: o.TrustPrefix,
		// check has no --rotation-prefix: the key records are where every
		// other command keeps them by default.
		Rotation: rotation.DefaultPrefix})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("etcd did not answer (%w): cannot tell whether the bundle drops a key a live apiserver signs with", a.Etcd.Err(err))
	}
	var out []error
	for _, f := range files {
		kids, err := trust.BundleKeyIDs(f)
		if err != nil {
			continue // the file checks report it
		}
		for _, k := range rep.SigningKeysNotIn(kids) {
			out = append(out, fmt.Errorf("%s lacks key %s, which %s on %s signs with (trust record %s): every apiserver loading this bundle would refuse its tokens; publish that key again (kube-apiserver-safe-restart publish-key on %s), or, if nothing on %s signs with it any more (host removed or reinstalled), delete its trust record (etcdctl del %s)",
				f, k.Kid, k.Signer, k.Host, trust.Key(o.TrustPrefix, k.Host), k.Host, k.Host, trust.Key(o.TrustPrefix, k.Host)))
		}
	}
	return out, nil
}
