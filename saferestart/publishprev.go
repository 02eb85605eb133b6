package saferestart

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/internal/trust"
)

// keptRecord says which keys publish-key --certificate keeps published
// beside the current certificate, and until when: a renewal with a new key
// must not withdraw a key the apiserver may still sign with (until its
// restart) or tokens still carry. retire-keys drops each once due. It
// names keys by ID only.
type keptRecord struct {
	Host string               `json:"host"`
	Keep map[string]time.Time `json:"keep"` // key ID -> retire after
}

// keptKey is PREFIX/HOST/kept, beside the rotation state.
func (p *publisher) keptKey(host string) string {
	return etcdkey.Join(p.a.o.rotationPrefix, host, "kept")
}

func (p *publisher) loadKept(ctx context.Context, cli *clientv3.Client, host string) (*keptRecord, int64, error) {
	a := p.a
	gctx, cancel := a.opCtx(ctx)
	defer cancel()
	resp, err := cli.Get(gctx, p.keptKey(host))
	if err != nil {
		return nil, 0, a.etcdErr(err)
	}
	rec := &keptRecord{Host: host, Keep: map[string]time.Time{}}
	if len(resp.Kvs) == 0 {
		return rec, 0, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, rec); err != nil {
		return nil, 0, fmt.Errorf("%s: unparseable (%v): delete it to start over", p.keptKey(host), err)
	}
	if rec.Keep == nil {
		rec.Keep = map[string]time.Time{}
	}
	return rec, resp.Kvs[0].ModRevision, nil
}

// withPrevious is a certificate publication: the new items plus every item
// of the current value whose key the new ones lack, each kept until
// --grace from when it was first replaced (0: none kept). It returns the
// items and the record to store with them.
func (p *publisher) withPrevious(items, cur []pubItem, rec *keptRecord, now time.Time) ([]pubItem, *keptRecord) {
	a := p.a
	have := map[string]bool{}
	for _, it := range items {
		have[it.kid] = true
	}
	next := &keptRecord{Host: rec.Host, Keep: map[string]time.Time{}}
	out := append([]pubItem(nil), items...)
	if a.o.grace > 0 {
		for _, it := range cur {
			if have[it.kid] {
				continue
			}
			have[it.kid] = true
			until, ok := rec.Keep[it.kid]
			if !ok {
				until = now.Add(a.o.grace)
			}
			next.Keep[it.kid] = until
			out = append(out, it)
		}
	}
	sortItems(out)
	return out, next
}

// retireKept is retire-keys for what publish-key --certificate kept: every
// kept key whose time is over leaves the published value, except one this
// host still signs with.
func (p *publisher) retireKept(ctx context.Context, cli *clientv3.Client, host string, log logrus.FieldLogger) error {
	a := p.a
	rec, recRev, err := p.loadKept(ctx, cli, host)
	if err != nil || len(rec.Keep) == 0 {
		return err
	}
	now := time.Now()
	signing := p.signingKeyIDs()
	var due []string
	for kid, until := range rec.Keep {
		switch {
		case now.Before(until):
			log.WithField("kept", kid).Infof("previous key %s stays published until %s", kid, until.UTC().Format(time.RFC3339))
		case slices.Contains(signing, kid):
			log.WithField("kept", kid).Warnf("previous key %s is due, but %s still signs with it: kept", kid, a.o.signingKey)
		default:
			due = append(due, kid)
		}
	}
	if len(due) == 0 {
		return nil
	}
	key := trust.Key(a.o.keysPrefix, host)
	gctx, cancel := a.opCtx(ctx)
	resp, err := cli.Get(gctx, key)
	cancel()
	if err != nil {
		return a.etcdErr(err)
	}
	var cur []pubItem
	rev := int64(0)
	if len(resp.Kvs) > 0 {
		rev = resp.Kvs[0].ModRevision
		if cur, err = canonicalItems(key, resp.Kvs[0].Value, true); err != nil {
			return err
		}
	}
	var keep []pubItem
	for _, it := range cur {
		if !slices.Contains(due, it.kid) {
			keep = append(keep, it)
		}
	}
	if len(keep) == 0 {
		return fmt.Errorf("%s would publish no key without %s: not retiring", key, strings.Join(due, ", "))
	}
	for _, kid := range due {
		delete(rec.Keep, kid)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	pctx, cancel := a.opCtx(ctx)
	defer cancel()
	tr, err := cli.Txn(pctx).If(
		clientv3.Compare(clientv3.ModRevision(key), "=", rev),
		clientv3.Compare(clientv3.ModRevision(p.keptKey(host)), "=", recRev),
	).Then(clientv3.OpPut(key, string(joinItems(keep))), clientv3.OpPut(p.keptKey(host), string(data))).Commit()
	if err != nil {
		return a.etcdErr(err)
	}
	if !tr.Succeeded {
		return fmt.Errorf("%s changed while retiring: run retire-keys again", key)
	}
	log.WithField("retired", strings.Join(due, ",")).Infof("previous key(s) %s no longer published; every apiserver drops them at its next restart", strings.Join(due, ", "))
	return nil
}

// signingKeyIDs are the key IDs in --signing-key, if it can be read: a key
// the apiserver signs with is never withdrawn.
func (p *publisher) signingKeyIDs() []string {
	a := p.a
	if a.o.signingKey == "" {
		return nil
	}
	f, err := pemcheck.ReadFile(a.o.signingKey)
	if err != nil {
		return nil
	}
	ids, _ := f.KeyIDs()
	return ids
}
