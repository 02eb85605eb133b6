package saferestart

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/internal/trust"
)

// pubItem is one key (or certificate) of a published value.
type pubItem struct {
	kid  string
	pem  []byte
	cert bool
}

// canonicalItems reads a published value the way it is compared and
// written: each key re-encoded as pemNormalize writes it (PKIX "PUBLIC
// KEY", LF, 64 columns), a certificate as its key unless keepCerts (then
// re-armoured as it is), one item per key, sorted by key ID. A private key
// is an error that never quotes it.
func canonicalItems(name string, data []byte, keepCerts bool) ([]pubItem, error) {
	f, err := pemcheck.Parse(name, data)
	if err != nil {
		return nil, err
	}
	var out []pubItem
	seen := map[string]bool{}
	for _, b := range f.Blocks {
		switch {
		case b.Kind == pemcheck.PrivateKey:
			return nil, fmt.Errorf("%s %s: %w: a private key must never be published", name, b, pemcheck.ErrPrivateKey)
		case b.Public == nil:
			continue // EC PARAMETERS beside a key
		}
		kid, err := pemcheck.KeyID(b.Public)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, b, err)
		}
		it := pubItem{kid: kid}
		if b.Cert != nil && keepCerts {
			it.cert, it.pem = true, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Cert.Raw})
		} else if it.pem, err = pemcheck.PublicPEM(b.Public); err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, b, err)
		}
		id := kid
		if keepCerts {
			id = string(it.pem)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, it)
	}
	sortItems(out)
	return out, nil
}

func sortItems(items []pubItem) {
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].kid != items[j].kid {
			return items[i].kid < items[j].kid
		}
		return bytes.Compare(items[i].pem, items[j].pem) < 0
	})
}

func joinItems(items []pubItem) []byte {
	var out []byte
	for _, it := range items {
		out = append(out, it.pem...)
	}
	return out
}

// publishSource is what publish-key publishes: --certificate, else
// --public-key, else the public half of --signing-key.
// publisher is publish-key, and the kept keys retire-keys drops.
type publisher struct{ a *app }

func (p *publisher) publishSource() (name string, items []pubItem, err error) {
	a := p.a
	o := a.o
	switch {
	case o.certificate != "":
		name = o.certificate
	case o.publicKey != "":
		name = o.publicKey
	default:
		name = o.signingKey
		f, err := pemcheck.ReadFile(name)
		if err != nil {
			return name, nil, err
		}
		var out []pubItem
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
			out = append(out, pubItem{kid: kid, pem: p})
		}
		if len(out) != 1 {
			return name, nil, fmt.Errorf("--signing-key %s: holds %d private keys, want 1", name, len(out))
		}
		if err := pemcheck.CheckPublishable(f); err != nil {
			return name, nil, err
		}
		return name, out, nil
	}
	// The same rules as `check --public-only FILE`: what confd's check
	// would refuse in the bundle is refused here, before it is published.
	if err := preflight.CheckFiles(context.Background(), []string{name}, preflight.CheckOptions{PublicOnly: true, Now: time.Now()}); err != nil {
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
	items, err = canonicalItems(name, data, o.certificate != "")
	return name, items, err
}

// publishKey is the `publish-key` subcommand: this host's public key(s)
// to KEYS-PREFIX/HOST, written only when the canonical value changed, so
// that a republished unchanged key makes no revision (and no restart).
func (p *publisher) publishKey(ctx context.Context, cli *clientv3.Client) int {
	a := p.a
	o := a.o
	host := a.trustHost(ctx)
	key := trust.Key(o.keysPrefix, host)
	log := a.log.WithFields(logrus.Fields{"host": host, "key": key})
	name, items, err := p.publishSource()
	if err != nil {
		for _, e := range splitErrors(err) {
			log.WithError(e).Error("publish-key: refusing to publish; nothing written")
		}
		return exitPreflight
	}
	// A compare-and-swap on the key's revision: rotate-key (or a second
	// publisher) writing meanwhile makes this read again, never lose it.
	for attempt := 1; ; attempt++ {
		gctx, cancel := a.opCtx(ctx)
		resp, err := cli.Get(gctx, key)
		cancel()
		if err != nil {
			log.WithError(a.etcdErr(err)).Error("publish-key: cannot read the published value")
			return exitError
		}
		var cur []byte
		rev := int64(0)
		if len(resp.Kvs) > 0 {
			cur, rev = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
		}
		conds := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)}
		var ops []clientv3.Op
		want := items
		if o.certificate != "" {
			// A renewal with a new key keeps the previous one published
			// until retire-keys after --grace.
			rec, recRev, err := p.loadKept(ctx, cli, host)
			if err != nil {
				log.WithError(err).Error("publish-key: cannot read what is kept published")
				return exitError
			}
			prev, _ := canonicalItems(key, cur, true) // unparseable: nothing to keep
			var next *keptRecord
			want, next = p.withPrevious(items, prev, rec, time.Now())
			if !keptEqual(rec, next) {
				data, err := json.Marshal(next)
				if err != nil {
					log.WithError(err).Error("publish-key")
					return exitError
				}
				conds = append(conds, clientv3.Compare(clientv3.ModRevision(p.keptKey(host)), "=", recRev))
				ops = append(ops, clientv3.OpPut(p.keptKey(host), string(data)))
			}
			for kid, until := range next.Keep {
				log.WithField("kept", kid).Infof("previous key %s stays published beside %s until retire-keys after %s", kid, name, until.UTC().Format(time.RFC3339))
			}
		}
		value := p.publishedValue(log, key, cur, want)
		if bytes.Equal(value, cur) && len(ops) == 0 {
			log.WithField("keys", kids(value)).Infof("%s: published value unchanged: nothing written", name)
			return exitOK
		}
		if !bytes.Equal(value, cur) {
			ops = append(ops, clientv3.OpPut(key, string(value)))
		}
		pctx, cancel := a.opCtx(ctx)
		tr, err := cli.Txn(pctx).If(conds...).Then(ops...).Commit()
		cancel()
		if err != nil {
			log.WithError(a.etcdErr(err)).Error("publish-key: cannot write the published value")
			return exitError
		}
		if tr.Succeeded {
			log.WithFields(logrus.Fields{"keys": kids(value), "revision": tr.Header.Revision}).Infof("%s published", name)
			return exitOK
		}
		if attempt == 3 {
			log.Errorf("publish-key: %s keeps changing under us (3 attempts): try again", key)
			return exitError
		}
	}
}

// publishedValue is the value to write given the current one: the source's
// items; in the current value's canonical form when the keys are the same
// (then nothing is written).
func (p *publisher) publishedValue(log logrus.FieldLogger, key string, cur []byte, items []pubItem) []byte {
	a := p.a
	value := joinItems(items)
	if len(cur) == 0 {
		return value
	}
	have, err := canonicalItems(key, cur, a.o.certificate != "")
	if err != nil {
		// A bad current value is replaced; the error says why, not what.
		log.WithError(err).Warn("the published value does not parse as public keys: replacing it")
		return value
	}
	if bytes.Equal(joinItems(have), value) {
		return cur
	}
	return value
}

// kids lists the key IDs in a published value, for logs.
func kids(value []byte) []string {
	items, err := canonicalItems("value", value, false)
	if err != nil {
		return nil
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.kid
	}
	return out
}

func keptEqual(a, b *keptRecord) bool {
	if len(a.Keep) != len(b.Keep) {
		return false
	}
	for k, v := range a.Keep {
		if w, ok := b.Keep[k]; !ok || !w.Equal(v) {
			return false
		}
	}
	return true
}
