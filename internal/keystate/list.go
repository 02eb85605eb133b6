package keystate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
)

// SupersededKey is one superseded key of a host, for reports.
type SupersededKey struct {
	KID         string    `json:"kid"`
	Since       time.Time `json:"since"`
	RetireAfter time.Time `json:"retire_after"`
	By          string    `json:"by,omitempty"`
}

// HostKeys is one host's keys as `trust` and `status` show them: the
// current ones (published and not superseded), the superseded ones with
// their retire time, and whether forget-host removed the host.
type HostKeys struct {
	Host       string          `json:"host"`
	Current    []string        `json:"current"`
	Superseded []SupersededKey `json:"superseded"`
	// Forgotten is when forget-host removed the host (nil: a member).
	Forgotten *time.Time `json:"forgotten,omitempty"`
	// KeysError says why the value or the record could not be read; Current
	// is then every key the value holds, so that nothing is left out of a
	// wait for it.
	KeysError string `json:"keys_error,omitempty"`
}

// Gone reports whether forget-host removed the host.
func (h HostKeys) Gone() bool { return h.Forgotten != nil }

// Text is the host's keys in a line.
func (h HostKeys) Text() string {
	var parts []string
	if h.Forgotten != nil {
		parts = append(parts, "GONE (forget-host "+h.Forgotten.UTC().Format(time.RFC3339)+")")
	}
	if len(h.Current) > 0 {
		parts = append(parts, "current "+strings.Join(h.Current, ", "))
	} else if h.Forgotten == nil {
		parts = append(parts, "no current key")
	}
	for _, s := range h.Superseded {
		parts = append(parts, fmt.Sprintf("superseded %s (by %s, retired after %s)", s.KID, s.By, s.RetireAfter.UTC().Format(time.RFC3339)))
	}
	if h.Forgotten != nil && len(h.Superseded) == 0 {
		parts = append(parts, "every key retired")
	}
	if h.KeysError != "" {
		parts = append(parts, "UNREADABLE: "+h.KeysError)
	}
	return strings.Join(parts, "; ")
}

// List reads every host's value under KeysPrefix and key record under
// RecordPrefix at revision rev (0: now), by host. A host with a record
// but no value (a forgotten host whose keys are all retired, or one that
// never published) is listed too. One host's unreadable value or record
// is reported in its KeysError, not fatal.
func (s *Store) List(ctx context.Context, rev int64) (map[string]HostKeys, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev)} // 0: the latest
	kdir, rdir := etcdkey.Dir(s.KeysPrefix), etcdkey.Dir(s.RecordPrefix)
	resp, err := s.KV.Txn(ctx).Then(clientv3.OpGet(kdir, opts...), clientv3.OpGet(rdir, opts...)).Commit()
	if err != nil {
		return nil, fmt.Errorf("read published keys %s and key records %s: %w", kdir, rdir, err)
	}
	states := map[string]*State{}
	get := func(host string) *State {
		if states[host] == nil {
			states[host] = &State{Host: host}
		}
		return states[host]
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		host := etcdkey.Host(s.KeysPrefix, string(kv.Key))
		if host == "" {
			continue
		}
		st := get(host)
		st.Items, st.ValueErr = ParseValue(string(kv.Key), kv.Value, true)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		host, what, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), rdir), "/")
		if host == "" || what != "kept" {
			continue
		}
		get(host).recordRaw = kv.Value
	}
	out := map[string]HostKeys{}
	for host, st := range states {
		h := HostKeys{Host: host, Current: []string{}, Superseded: []SupersededKey{}}
		if st.ValueErr != nil {
			h.KeysError = st.ValueErr.Error()
		}
		rec, err := parseRecord(s.RecordKey(host), host, st.recordRaw, st.Items)
		if err != nil {
			h.KeysError = err.Error()
			rec = Record{Host: host}
		}
		for _, kid := range KIDs(st.Items) {
			if _, sup := rec.Superseded[kid]; !sup {
				h.Current = append(h.Current, kid)
			}
		}
		for kid, sup := range rec.Superseded {
			h.Superseded = append(h.Superseded, SupersededKey{KID: kid, Since: sup.Since, RetireAfter: sup.RetireAfter, By: sup.By})
		}
		slices.SortFunc(h.Superseded, func(a, b SupersededKey) int { return strings.Compare(a.KID, b.KID) })
		if !rec.Forgotten.IsZero() {
			h.Forgotten = &rec.Forgotten
		}
		out[host] = h
	}
	return out, nil
}
