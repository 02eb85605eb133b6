package keycmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// sourceFile is the file publish-key publishes: --certificate, else
// --public-key, else --signing-key (its public half).
func (o *PublishKey) sourceFile() string { return cmp.Or(o.Certificate, o.PublicKey, o.SigningKey) }

// publishSource is what publish-key publishes, read from sourceFile.
func (o *PublishKey) publishSource(ctx context.Context) (name string, items []keystate.Item, err error) {
	name = o.sourceFile()
	if o.Certificate == "" && o.PublicKey == "" {
		f, err := pemcheck.ReadFile(name)
		if err != nil {
			return name, nil, err
		}
		for _, b := range f.Blocks {
			if b.Kind != pemcheck.PrivateKey {
				continue
			}
			kid, err := pemcheck.KeyID(b.Public)
			if err != nil {
				return name, nil, fmt.Errorf("%s %s: %w", name, b, err)
			}
			p, err := pemcheck.PublicPEM(b.Public)
			if err != nil {
				return name, nil, fmt.Errorf("%s %s: %w", name, b, err)
			}
			items = append(items, keystate.Item{KID: kid, PEM: p})
		}
		if len(items) != 1 {
			return name, nil, fmt.Errorf("--signing-key %s: holds %d private keys, want 1", name, len(items))
		}
		return name, items, pemcheck.CheckPublishable(f)
	}
	// The same rules as `check --public-only FILE`: what confd's check
	// would refuse in the bundle is refused here, before it is published.
	if err := preflight.CheckFiles(ctx, []string{name}, preflight.CheckOptions{PublicOnly: true, Now: time.Now()}); err != nil {
		return name, nil, err
	}
	// Beyond what the bundle's check refuses: one leaf, no weak RSA key
	// (every key published here is served and trusted fleet-wide).
	f, err := pemcheck.ReadFile(name)
	if err != nil {
		return name, nil, err
	}
	if err := pemcheck.CheckPublishable(f); err != nil {
		return name, nil, err
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return name, nil, err
	}
	items, err = keystate.ParseValue(name, data, o.Certificate != "")
	return name, items, err
}

func (o *PublishKey) Run(ctx context.Context, e *cmdkit.Env) int {
	if o.Watch {
		return e.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int { return o.publishWatch(ctx, e, cli) })
	}
	return e.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int { return o.publishKey(ctx, e, cli) })
}

// publishKey is the `publish-key` subcommand: this host's public key(s)
// to KEYS-PREFIX/HOST. Every key of the published value the source lacks
// (a reimage's lost key, a renewed certificate's, a key removed from
// sa.pub by hand) stays published as superseded until retire-keys after
// --grace: tokens it signed keep verifying meanwhile. Nothing is written
// when nothing changed, so a republished unchanged key makes no revision
// (and no restart).
func (o *PublishKey) publishKey(ctx context.Context, a *cmdkit.Env, cli *clientv3.Client) int {
	host := a.TrustHost(ctx)
	store := cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix)
	log := a.Log.WithFields(logrus.Fields{"host": host, "key": store.ValueKey(host)})
	name, items, err := o.publishSource(ctx)
	if err != nil {
		for _, e := range cmdkit.SplitErrors(err) {
			log.WithError(e).Error("publish-key: refusing to publish; nothing written")
		}
		return cmdkit.ExitPreflight
	}
	var dropped []string
	wctx, cancel := a.OpCtx(ctx)
	res, err := store.Update(wctx, host, func(cur keystate.State) (keystate.State, error) {
		if cur.ValueErr != nil {
			// A bad current value is replaced; the error says why, not what.
			log.WithError(cur.ValueErr).Warn("the published value does not parse as public keys: replacing it")
		}
		next, d, err := cur.Publish(items, byPublishKey, time.Now(), o.Grace)
		dropped = d
		return next, err
	})
	cancel()
	if errors.Is(err, keystate.ErrRetired) {
		log.WithError(err).Errorf("publish-key: %s holds only retired keys: nothing written", name)
		return cmdkit.ExitPreflight
	}
	if err != nil {
		log.WithError(a.Etcd.Err(err)).Error("publish-key: cannot write the published value")
		return cmdkit.ExitError
	}
	if len(dropped) > 0 {
		log.Warnf("%s holds retired key(s) %s: not published (retired keys are never published again)", name, strings.Join(dropped, ", "))
	}
	for _, kid := range slices.Sorted(maps.Keys(res.Record.Superseded)) {
		s := res.Record.Superseded[kid]
		log.WithField("superseded", kid).Infof("superseded key %s stays published beside %s until retire-keys after %s", kid, name, s.RetireAfter.UTC().Format(time.RFC3339))
	}
	kids := keystate.KIDs(res.Items)
	if res.Wrote {
		log.WithFields(logrus.Fields{"keys": kids, "revision": res.Revision}).Infof("%s published", name)
	} else {
		log.WithField("keys", kids).Infof("%s: published value unchanged: nothing written", name)
	}
	cmdkit.TrimOwnFiles(res.Record, o.SigningKey, o.PublicKey, o.Certificate, log)
	return cmdkit.ExitOK
}
