package trust

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/pemcheck"
)

// Host is one row of the trust table.
type Host struct {
	Host string `json:"host"`
	// Publishes lists the key IDs of the keys the host publishes (empty for
	// a host that only has a record).
	Publishes []string `json:"publishes"`
	// PublishError says why the published value yields no key ID.
	PublishError string `json:"publish_error,omitempty"`
	// Warnings name what in the published value is served but should not
	// be (an RSA key under 2048 bits), or is not served though published
	// (a certificate authority's key), each with its block. They change
	// neither Stale nor the exit code: a weak key already published signs
	// live tokens, and refusing it at once would refuse them.
	Warnings []string `json:"warnings,omitempty"`
	// Record is the host's trust record; nil when it has none.
	Record *Record `json:"record"`
	// Missing lists published key IDs (of any host) its record lacks.
	Missing []string `json:"missing"`
	// Unpublished lists the keys its record says its apiserver (or
	// kube-apiserver-sa-signer) or kube-controller-manager signs with that
	// no host publishes: every bundle rendered now drops them, and the
	// tokens signed with them are refused (see SigningKeysNotIn).
	Unpublished []string `json:"unpublished_signing_keys"`
	// Stale: the host publishes current keys but has no record, or its
	// record lacks a key that is published now (its apiserver was last
	// restarted before that key appeared), or it signs with a key no host
	// publishes.
	Stale bool `json:"stale"`
	// HostKeys is the host's key lifecycle (Prefixes.Rotation's key
	// records): current keys, superseded keys with their retire time, and
	// whether forget-host removed it. Without Prefixes.Rotation, every
	// published key is current.
	keystate.HostKeys
}

// Report is every host's published keys and trust, read at one revision.
type Report struct {
	Revision int64 `json:"revision"`
	// Keys lists every key ID that is published or trusted somewhere:
	// published ones first, in host order.
	Keys      []string `json:"keys"`
	Published []string `json:"published"`
	Hosts     []Host   `json:"hosts"`
	// Lifecycle is every host's key lifecycle as read with Prefixes.Rotation
	// (hosts with a key record alone included); nil without it.
	Lifecycle map[string]keystate.HostKeys `json:"-"`
}

// Prefixes names where the published keys and the trust records live.
type Prefixes struct {
	Keys  string
	Trust string
	// Rotation is where the key records (ROTATION/HOST/kept) say which
	// published keys are superseded and which hosts forget-host removed;
	// empty: not read, every published key is current.
	Rotation string
}

// Collect reads published keys and trust records at one revision.
func Collect(ctx context.Context, kv clientv3.KV, p Prefixes) (*Report, error) {
	keys, err := kv.Get(ctx, etcdkey.Dir(p.Keys), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read published keys %s: %w", etcdkey.Dir(p.Keys), err)
	}
	rev := keys.Header.Revision
	records, _, err := List(ctx, kv, p.Trust, clientv3.WithRev(rev))
	if err != nil {
		return nil, err
	}
	published := map[string][]string{}
	pubErr := map[string]string{}
	warnings := map[string][]string{}
	for _, kv := range keys.Kvs {
		host := etcdkey.Host(p.Keys, string(kv.Key))
		if host == "" {
			continue // not a host's key
		}
		kids, warn, err := publishedKeyIDs(string(kv.Key), kv.Value)
		published[host], warnings[host] = kids, warn
		if err != nil {
			pubErr[host] = err.Error()
		}
	}
	var life map[string]keystate.HostKeys
	if p.Rotation != "" {
		if life, err = (&keystate.Store{KV: kv, KeysPrefix: p.Keys, RecordPrefix: p.Rotation}).List(ctx, rev); err != nil {
			return nil, err
		}
	}
	return build(rev, published, pubErr, warnings, records, life), nil
}

// publishedKeyIDs is the key IDs of a host's published value as the bundle
// template and the signer read it: a certificate authority's key is not
// served (issue 34), so it is not published either, or every host would
// look stale for not trusting it; it is named in a warning instead, as is
// an RSA key under 2048 bits, which stays published.
func publishedKeyIDs(name string, data []byte) (kids, warnings []string, err error) {
	f, err := pemcheck.Parse(name, data)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range f.WeakKeys() {
		warnings = append(warnings, e.Error())
	}
	drop := map[int]bool{}
	for _, ca := range f.CAs() {
		drop[ca.Block.Index] = true
		warnings = append(warnings, fmt.Sprintf("%s %s: %v: %s: not served", name, ca.Block, pemcheck.ErrCA, ca.Reason))
	}
	kept := &pemcheck.File{Name: f.Name, Blocks: slices.DeleteFunc(slices.Clone(f.Blocks), func(b pemcheck.Block) bool { return drop[b.Index] })}
	kids, err = keyIDs(kept)
	return kids, warnings, err
}

// CollectRecorded reads the trust records alone, for a wait among the
// recorded hosts: every row has a record and publishes nothing.
func CollectRecorded(ctx context.Context, kv clientv3.KV, trustPrefix string) (*Report, error) {
	records, rev, err := List(ctx, kv, trustPrefix)
	if err != nil {
		return nil, err
	}
	return build(rev, nil, nil, nil, records, nil), nil
}

// build is Collect without etcd. life is each host's key records: a host
// whose published keys are all superseded (forget-host removed it)
// publishes no current key, so it is no longer a publisher that waits,
// fleet checks and staleness count; its superseded keys stay published,
// and every other host must still trust them until they are retired.
func build(rev int64, published map[string][]string, pubErr map[string]string, warnings map[string][]string, records map[string]Record, life map[string]keystate.HostKeys) *Report {
	r := &Report{Revision: rev, Keys: []string{}, Published: []string{}, Hosts: []Host{}, Lifecycle: life}
	hosts := slices.Concat(slices.Collect(maps.Keys(published)), slices.Collect(maps.Keys(records)))
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	add := func(list *[]string, kid string) {
		if !slices.Contains(*list, kid) {
			*list = append(*list, kid)
		}
	}
	for _, h := range hosts {
		for _, kid := range published[h] {
			add(&r.Published, kid)
			add(&r.Keys, kid)
		}
	}
	for _, h := range hosts {
		for _, kid := range records[h].Trusted {
			add(&r.Keys, kid)
		}
		if cm := records[h].ControllerManagerSigning; cm != "" {
			add(&r.Keys, cm)
		}
	}
	for _, h := range hosts {
		row := Host{Host: h, Publishes: append([]string{}, published[h]...), PublishError: pubErr[h], Warnings: warnings[h]}
		if rec, ok := records[h]; ok {
			row.Record = &rec
		}
		row.HostKeys = keystate.HostKeys{Host: h, Current: row.Publishes, Superseded: []keystate.SupersededKey{}}
		if l, ok := life[h]; ok {
			if l.KeysError != "" {
				// Unreadable record: every published key counts as current,
				// so that no wait leaves the host out on a guess.
				l.Current = row.Publishes
			}
			row.HostKeys = l
		}
		row.Missing = slices.DeleteFunc(slices.Clone(r.Published), func(kid string) bool { return row.Record.Trusts(kid) })
		row.Unpublished = []string{}
		for _, k := range signingKeys(row) {
			if !slices.Contains(r.Published, k.Kid) && !slices.Contains(row.Unpublished, k.Kid) {
				row.Unpublished = append(row.Unpublished, k.Kid)
			}
		}
		row.Stale = row.in(Publishers) && (row.Record == nil || len(row.Missing) > 0) || len(row.Unpublished) > 0
		r.Hosts = append(r.Hosts, row)
	}
	return r
}

// SigningKey is a key that a host's trust record says something there
// signs tokens with.
type SigningKey struct {
	Host string `json:"host"`
	Kid  string `json:"kid"`
	// Signer is "kube-apiserver", "kube-apiserver-sa-signer" (a record in
	// signer mode) or "kube-controller-manager".
	Signer string `json:"signer"`
}

// SigningKeysNotIn returns the keys a trust record says a host's
// apiserver, signer or kube-controller-manager signs with that are not
// among kids (the key IDs a bundle holds), in host order: the keys such a
// bundle would silently drop, making every apiserver loading it refuse
// their tokens.
//
// A host whose published keys are all unknown to its own record is left
// out: its key pair was replaced (a reimaged host, whose old private key is
// gone with the apiserver and controller-manager that signed with it), and
// the record describes processes that no longer run. Its new apiserver waits
// in the trust gate until every host trusts the new key, which a bundle
// that kept requiring the old one would never let happen. A host that
// publishes nothing (its value deleted), a value that does not parse, or a
// key its record already trusts (a key withdrawn by hand after a rotation)
// is no such replacement, and its keys stay required.
func (r *Report) SigningKeysNotIn(kids []string) []SigningKey {
	var out []SigningKey
	for _, h := range r.Hosts {
		for _, k := range signingKeys(h) {
			if !slices.Contains(kids, k.Kid) {
				out = append(out, k)
			}
		}
	}
	return out
}

// signingKeys is the signing keys of one row (Publishes and PublishError
// set), as SigningKeysNotIn counts them.
func signingKeys(h Host) []SigningKey {
	rec := h.Record
	if rec == nil || rec.Unparseable != "" ||
		len(h.Publishes) > 0 && h.PublishError == "" && !slices.ContainsFunc(h.Publishes, rec.Trusts) { // replaced
		return nil
	}
	var out []SigningKey
	add := func(kid, signer string) {
		if kid != "" {
			out = append(out, SigningKey{Host: h.Host, Kid: kid, Signer: signer})
		}
	}
	if rec.Mode() == "signer" {
		add(rec.Signing, SignerSource)
	} else {
		add(rec.Signing, "kube-apiserver")
	}
	add(rec.ControllerManagerSigning, "kube-controller-manager")
	return out
}

// Among names the hosts that must trust a key.
type Among int

const (
	// Publishers: the hosts that publish keys. A host with a record that
	// publishes nothing is not a master of the fleet now.
	Publishers Among = iota
	// Recorded: the hosts that have a trust record, publishing keys or
	// not, and no other. The signer's barrier waits for these: a signer's
	// record says what its apiserver fetched, whatever its host publishes,
	// and a host with no record has no apiserver known to fetch keys.
	Recorded
)

// in reports whether h is among a.
func (h *Host) in(a Among) bool {
	if a == Recorded {
		return h.Record != nil
	}
	return !h.Gone() && (len(h.Current) > 0 || h.PublishError != "")
}

// NotTrustingAmong returns the hosts among a (except those in exclude)
// whose record does not trust every one of kids, sorted.
func (r *Report) NotTrustingAmong(a Among, kids []string, exclude []string) []string {
	return r.hostsWhere(func(h *Host) bool {
		return h.in(a) && !slices.Contains(exclude, h.Host) && slices.ContainsFunc(kids, func(kid string) bool { return !h.Record.Trusts(kid) })
	})
}

// Stale returns the stale hosts, sorted.
func (r *Report) Stale() []string { return r.hostsWhere(func(h *Host) bool { return h.Stale }) }

// hostsWhere returns the hosts for which keep is true, in the report's
// order (sorted).
func (r *Report) hostsWhere(keep func(*Host) bool) []string {
	var out []string
	for i := range r.Hosts {
		if keep(&r.Hosts[i]) {
			out = append(out, r.Hosts[i].Host)
		}
	}
	return out
}

// RecordOf is host's trust record, nil if it has none.
func (r *Report) RecordOf(host string) *Record {
	for _, h := range r.Hosts {
		if h.Host == host {
			return h.Record
		}
	}
	return nil
}

// Gone returns the hosts forget-host removed that still have published
// keys (superseded, until retire-keys) or a trust record, sorted.
func (r *Report) Gone() []string {
	return r.hostsWhere(func(h *Host) bool { return h.HostKeys.Gone() })
}

// Unrecorded returns the hosts that publish keys but have no trust record.
func (r *Report) Unrecorded() []string {
	return r.hostsWhere(func(h *Host) bool { return h.Record == nil })
}

// Publishers returns the hosts that publish keys, except those in exclude.
func (r *Report) Publishers(exclude []string) []string {
	return r.hostsWhere(func(h *Host) bool { return h.in(Publishers) && !slices.Contains(exclude, h.Host) })
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes a table of hosts × key IDs: "S" the host signs with the
// key, "T" it trusts it, "-" it does not; then the stale hosts.
func (r *Report) WriteText(w io.Writer) error {
	if len(r.Hosts) == 0 {
		_, err := fmt.Fprintf(w, "no host publishes keys and no trust record exists (revision %d)\n", r.Revision)
		return err
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "HOST")
	for i := range r.Keys {
		fmt.Fprintf(tw, "\tK%d", i+1)
	}
	fmt.Fprint(tw, "\tMODE\tRECORDED\tSTATE\n")
	withCM := false
	for _, h := range r.Hosts {
		fmt.Fprint(tw, h.Host)
		for _, kid := range r.Keys {
			cell := "-"
			switch {
			case h.Record != nil && h.Record.Signing == kid:
				cell = "S"
			case h.Record.Trusts(kid):
				cell = "T"
			}
			if h.Record != nil && h.Record.ControllerManagerSigning == kid {
				cell += "C"
				withCM = true
			}
			if slices.Contains(h.Publishes, kid) {
				cell += "*"
			}
			fmt.Fprintf(tw, "\t%s", cell)
		}
		when, mode := "never", "-"
		switch {
		case h.Record != nil && h.Record.Unparseable != "":
			when = "unparseable"
		case h.Record != nil:
			when, mode = h.Record.Time.UTC().Format(time.RFC3339), h.Record.Mode()
		}
		state := "ok"
		switch {
		case h.Record != nil && h.Record.Unparseable != "":
			state = "STALE: " + h.Record.Unparseable
		case h.PublishError != "":
			state = "bad published value: " + h.PublishError
		case h.Stale && h.Record == nil:
			state = "STALE: no trust record"
		case len(h.Unpublished) > 0:
			state = fmt.Sprintf("STALE: signs with %s, which no host publishes (bundles drop it: republish it, or delete this host's trust record if nothing there signs with it any more)", strings.Join(h.Unpublished, ", "))
		case h.Stale:
			state = fmt.Sprintf("STALE: does not trust %s", strings.Join(h.Missing, ", "))
		case h.HostKeys.Gone():
			state = "GONE: removed by forget-host " + h.Forgotten.UTC().Format(time.RFC3339) + "; its keys stay published until retired"
		case len(h.Publishes) == 0:
			state = "publishes no key"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\n", mode, when, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\nS signs with, T trusts, - does not trust; * published by this host\n")
	if withCM {
		b.WriteString("C its kube-controller-manager signs legacy token Secrets with (retire-keys refuses to retire it)\n")
	}
	b.WriteString("MODE bundle: trust as loaded at the last restart; signer: as fetched from kube-apiserver-sa-signer\n")
	for i, kid := range r.Keys {
		note := ""
		if !slices.Contains(r.Published, kid) {
			note = " (no longer published)"
		}
		fmt.Fprintf(&b, "K%d = %s%s\n", i+1, kid, note)
	}
	for _, h := range r.Hosts {
		if len(h.Publishes) > 0 || h.HostKeys.Gone() {
			fmt.Fprintf(&b, "keys of %s: %s\n", h.Host, h.HostKeys.Text())
		}
	}
	stale := strings.Join(r.Stale(), ", ")
	fmt.Fprintf(&b, "stale hosts: %s\n", cmp.Or(stale, "none"))
	for _, h := range r.Hosts {
		for _, w := range h.Warnings {
			fmt.Fprintf(&b, "warning: %s: %s\n", h.Host, w)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// SignerSource is the Source of records kube-apiserver-sa-signer writes.
const SignerSource = "kube-apiserver-sa-signer"

// Mode is "signer" for a record a signer wrote, "bundle" otherwise.
func (r *Record) Mode() string {
	if r != nil && r.Source == SignerSource {
		return "signer"
	}
	return "bundle"
}
