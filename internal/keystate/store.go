package keystate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
)

// attempts bounds Update's compare-and-swap retries.
const attempts = 5

// Store reads and writes hosts' values and records.
type Store struct {
	KV           clientv3.KV
	KeysPrefix   string // KEYS-PREFIX: values at KEYS-PREFIX/HOST
	RecordPrefix string // records at RECORD-PREFIX/HOST/kept, beside the rotation state
}

// ValueKey is host's published value.
func (s *Store) ValueKey(host string) string { return etcdkey.Join(s.KeysPrefix, host) }

// RecordKey is host's key record.
func (s *Store) RecordKey(host string) string { return etcdkey.Join(s.RecordPrefix, host, "kept") }

// Load reads host's value and record at one revision.
func (s *Store) Load(ctx context.Context, host string) (State, error) {
	vk, rk := s.ValueKey(host), s.RecordKey(host)
	resp, err := s.KV.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(rk)).Commit()
	if err != nil {
		return State{}, fmt.Errorf("read %s and %s: %w", vk, rk, err)
	}
	st := State{Host: host}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		st.value, st.valueRev = kvs[0].Value, kvs[0].ModRevision
		st.Items, st.ValueErr = ParseValue(vk, st.value, true)
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		st.recordRaw, st.recordRev = kvs[0].Value, kvs[0].ModRevision
	}
	if st.Record, err = parseRecord(rk, host, st.recordRaw, st.Items); err != nil {
		return State{}, err
	}
	return st, nil
}

// Hosts lists, sorted, every host with anything under RECORD-PREFIX (a key
// record, a rotation state): the hosts whose keys retire-keys looks at,
// whether or not they still run anything.
func (s *Store) Hosts(ctx context.Context) ([]string, error) {
	dir := etcdkey.Dir(s.RecordPrefix)
	resp, err := s.KV.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var hosts []string
	for _, kv := range resp.Kvs {
		h, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), dir), "/")
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	slices.Sort(hosts)
	return hosts, nil
}

// Result is what Update wrote.
type Result struct {
	State
	Wrote    bool  // anything written
	Revision int64 // the write's revision
}

// Value is the value as stored (its canonical bytes when nothing changed).
func (r Result) Value() []byte { return r.value }

// Update reads host's state, applies change, and writes the new value and
// record in one transaction that succeeds only if neither changed since
// the read; on a conflict it reads and applies change again, up to
// attempts times. Nothing is written when nothing changed: an unchanged
// republish makes no revision (and no restart).
func (s *Store) Update(ctx context.Context, host string, change func(State) (State, error)) (Result, error) {
	vk, rk := s.ValueKey(host), s.RecordKey(host)
	for attempt := 1; attempt <= attempts; attempt++ {
		cur, err := s.Load(ctx, host)
		if err != nil {
			return Result{}, err
		}
		next, err := change(cur)
		if err != nil {
			return Result{State: cur}, err
		}
		var ops []clientv3.Op
		value := Join(next.Items)
		switch {
		case len(next.Items) == 0 && !next.Record.Forgotten.IsZero():
			// A forgotten host's last key retired: its value goes, so that
			// no template renders an empty entry and trust forgets it.
			if cur.valueRev != 0 {
				ops = append(ops, clientv3.OpDelete(vk))
			}
			value = nil
		case cur.ValueErr != nil || !bytes.Equal(value, Join(cur.Items)):
			ops = append(ops, clientv3.OpPut(vk, string(value)))
		default:
			value = cur.value
		}
		rec, err := json.Marshal(next.Record)
		if err != nil {
			return Result{State: cur}, err
		}
		if !bytes.Equal(rec, cur.recordRaw) && !(len(cur.recordRaw) == 0 && next.Record.empty()) {
			ops = append(ops, clientv3.OpPut(rk, string(rec)))
		}
		next.value, next.valueRev, next.recordRev = value, cur.valueRev, cur.recordRev
		if len(ops) == 0 {
			return Result{State: next}, nil
		}
		tr, err := s.KV.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(vk), "=", cur.valueRev),
			clientv3.Compare(clientv3.ModRevision(rk), "=", cur.recordRev),
		).Then(ops...).Commit()
		if err != nil {
			return Result{State: cur}, fmt.Errorf("write %s and %s: %w", vk, rk, err)
		}
		if tr.Succeeded {
			return Result{State: next, Wrote: true, Revision: tr.Header.Revision}, nil
		}
	}
	return Result{}, fmt.Errorf("%s and %s kept changing under us (%d attempts): nothing written; run the command again", vk, rk, attempts)
}

// Retired reads every host's tombstones (host -> key ID -> when retired)
// in one read of RECORD-PREFIX. A record that does not parse is left out
// and named in bad: one host's damaged record must not hide the others'.
func (s *Store) Retired(ctx context.Context) (retired map[string]map[string]time.Time, bad []error, err error) {
	dir := etcdkey.Dir(s.RecordPrefix)
	resp, err := s.KV.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("read the key records under %s: %w", dir, err)
	}
	retired = map[string]map[string]time.Time{}
	for _, kv := range resp.Kvs {
		host, what, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), dir), "/")
		if host == "" || what != "kept" {
			continue
		}
		rec, err := parseRecord(string(kv.Key), host, kv.Value, nil)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if len(rec.Retired) > 0 {
			retired[host] = rec.Retired
		}
	}
	return retired, bad, nil
}
