package cmdkit

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// CodeError carries a subcommand's exit code through the rotation package.
type CodeError struct {
	Code int
	What string
}

func (e *CodeError) Error() string { return fmt.Sprintf("%s (exit %d)", e.What, e.Code) }

// UpdateKeys applies change to host's published key set (one
// compare-and-swap, retried on conflict).
func UpdateKeys(ctx context.Context, a *Env, store *keystate.Store, host string, change func(keystate.State) (keystate.State, error)) error {
	uctx, cancel := a.OpCtx(ctx)
	defer cancel()
	_, err := store.Update(uctx, host, change)
	return a.Etcd.Err(err)
}

// KeyStore is the hosts' published keys (under keysPrefix) and key
// records (under rotationPrefix).
func KeyStore(cli clientv3.KV, keysPrefix, rotationPrefix string) *keystate.Store {
	return &keystate.Store{KV: cli, KeysPrefix: keysPrefix, RecordPrefix: rotationPrefix}
}

// TrimOwnFiles removes keys retired (by any master's retire-keys) from
// this host's own key files (signingKey, and publicKey unless a
// certificate is published); a failure is logged, never fatal: the
// published value already leaves them out.
func TrimOwnFiles(rec keystate.Record, signingKey, publicKey, certificate string, log logrus.FieldLogger) {
	if len(rec.Retired) == 0 {
		return
	}
	files := rotation.Files{SigningKey: signingKey}
	if certificate == "" {
		files.PublicKey = publicKey
	}
	retired := func(kid string) bool { _, ok := rec.Retired[kid]; return ok }
	if err := files.TrimRetired(retired, log); err != nil {
		log.WithError(err).Warn("cannot remove retired keys from this host's key files")
	}
}
