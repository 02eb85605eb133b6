package restartcmd

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// signerReloadCommand makes kube-apiserver-sa-signer re-read its key file
// (the unit's ExecReload sends SIGHUP). `-- COMMAND` replaces it.
var signerReloadCommand = []string{"systemctl", "reload", "kube-apiserver-sa-signer.service"}

// signerSwitch is rotate-key --signer's install step: with the next key
// installed in --signing-key, reload the signer (no apiserver restart) and
// wait until its trust record says it signs with that key. The signer's own
// barrier holds the switch until every recorded host's apiserver fetched
// the key; at --trust-timeout the previous key keeps signing and this
// exits 5 naming the hosts that did not fetch it.
func (k *Step) signerSwitch(ctx context.Context) error {
	o, cli, host := k.Opts, k.Client, k.Name
	ids, err := trust.FileKeyIDs(o.SigningKey)
	if err != nil || len(ids) != 1 {
		return fmt.Errorf("installed signing key %s: %v (want one key)", o.SigningKey, err)
	}
	kid := ids[0]
	argv := o.Argv
	if slices.Equal(argv, DefaultCommand) {
		argv = signerReloadCommand
	}
	log := k.Log.WithField("host", host).WithField("next", kid)
	log.WithField("command", runner.Quote(argv)).Info("reloading the signer: the apiserver is not restarted")
	res := runner.Run(ctx, runner.Spec{
		Argv: argv, Env: runner.WithoutVars(os.Environ(), SecretEnv...), Timeout: o.RestartTimeout,
		Stdout: k.Stderr, Stderr: k.Stderr, ParentDeathSignal: syscall.SIGKILL,
	})
	if res.Err != nil {
		return &cmdkit.CodeError{Code: cmdkit.ExitError, What: fmt.Sprintf("signer reload %s: %v", runner.Quote(argv), res.Err)}
	}
	wctx, cancel := context.WithTimeout(ctx, o.TrustTimeout)
	defer cancel()
	start := time.Now()
	for {
		rctx, rcancel := k.OpCtx(wctx)
		recs, rev, err := trust.List(rctx, cli, o.TrustPrefix)
		rcancel()
		if err == nil {
			if r, ok := recs[host]; ok && r.Signing == kid {
				log.WithField("waited", time.Since(start).Round(time.Millisecond).String()).Info("the signer signs with the next key")
				return nil
			}
			select {
			case <-cli.Watch(clientv3.WithRequireLeader(wctx), etcdkey.Dir(o.TrustPrefix), clientv3.WithPrefix(), clientv3.WithRev(rev+1)):
			case <-wctx.Done():
			}
		} else {
			select {
			case <-time.After(time.Second):
			case <-wctx.Done():
			}
		}
		if wctx.Err() != nil {
			if cmdkit.Interrupted(ctx) {
				return ctx.Err()
			}
			var notFetched string // the hosts whose trust record does not list kid
			nctx, ncancel := k.OpCtx(context.Background())
			defer ncancel()
			if rep, err := trust.CollectRecorded(nctx, cli, o.TrustPrefix); err != nil {
				notFetched = "(unknown: " + err.Error() + ")"
			} else {
				notFetched = strings.Join(rep.NotTrustingAmong(trust.Recorded, []string{kid}, nil), ", ")
			}
			return &cmdkit.CodeError{Code: cmdkit.ExitLockTimeout, What: fmt.Sprintf("the signer does not sign with %s within --trust-timeout %s; still signing with the previous key; hosts whose apiserver has not fetched it: %s",
				kid, o.TrustTimeout, notFetched)}
		}
	}
}
