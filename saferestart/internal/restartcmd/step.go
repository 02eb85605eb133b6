package restartcmd

import (
	"context"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// Step is rotate-key's install step (rotation.Rotator.Restart), on the etcd
// client rotate-key holds: this apiserver restarted through the lock, or,
// with Signer, the signer's switch to the next key; then
// kube-controller-manager when it holds the key. It never dials.
type Step struct {
	*cmdkit.Env
	Opts *cmdkit.Restarting
	// Signer is rotate-key --signer: this host signs through
	// kube-apiserver-sa-signer.
	Signer bool
	Client *clientv3.Client
	// Name is this host's name in the trust records.
	Name   string
	Logger logrus.FieldLogger
}

// Restart is the step (rotation.Rotator.Restart).
func (k *Step) Restart(ctx context.Context) error {
	if k.Signer {
		// The signer's barrier switched the apiserver's tokens to the new
		// key; kube-controller-manager has no external signer and still
		// signs legacy tokens from its key file: restarted as in bundle
		// mode, after every apiserver trusts the key.
		if err := k.signerSwitch(ctx); err != nil {
			return err
		}
	} else if code := k.Run(ctx); code != cmdkit.ExitOK {
		return &cmdkit.CodeError{Code: code, What: "restart through the lock failed"}
	}
	return k.restartControllerManager(ctx, k.Logger)
}

// Run is the restart alone, through the lock (text output: rotate-key has
// no --output); with --dry-run, what it would do.
func (k *Step) Run(ctx context.Context) int {
	return (&restarter{Env: k.Env, o: k.Opts, output: "text", cli: k.Client}).restart(ctx)
}
