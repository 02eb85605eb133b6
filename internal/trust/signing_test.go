package trust

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Which keys a bundle must keep: every key a record says a host's
// apiserver, signer or controller-manager signs with, except a key its own
// host replaced by publishing other keys (a reimage).
func TestSigningKeysNotIn(t *testing.T) {
	for _, tc := range []struct {
		name      string
		published map[string][]string
		pubErr    map[string]string
		records   map[string]Record
		bundle    []string
		want      []string // host/kid/signer
		stale     []string
	}{
		{name: "every signing key in the bundle",
			published: map[string][]string{"m1": {"k1"}, "m2": {"k2"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k1", ControllerManagerSigning: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2"},
			},
			bundle: []string{"k1", "k2"}},
		{name: "a live host's key deleted from etcd",
			published: map[string][]string{"m1": {"k1"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2"},
			},
			bundle: []string{"k1"},
			want:   []string{"m2/k2/kube-apiserver"}, stale: []string{"m2"}},
		{name: "a signer's key",
			published: map[string][]string{"m1": {"k1"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1"}, Signing: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2", Source: SignerSource},
			},
			bundle: []string{"k1"},
			want:   []string{"m2/k2/kube-apiserver-sa-signer"}, stale: []string{"m2"}},
		{name: "a controller-manager still signing with a withdrawn key",
			published: map[string][]string{"m1": {"k1"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k0", "k1"}, Signing: "k1", ControllerManagerSigning: "k0"},
			},
			bundle: []string{"k1"},
			want:   []string{"m1/k0/kube-controller-manager"}, stale: []string{"m1"}},
		{name: "a signing key withdrawn by hand, another one published",
			published: map[string][]string{"m1": {"k1"}, "m2": {"k3"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1", "k2", "k3"}, Signing: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1", "k2", "k3"}, Signing: "k2"},
			},
			bundle: []string{"k1", "k3"},
			want:   []string{"m2/k2/kube-apiserver"}, stale: []string{"m2"}},
		{name: "a key published by another host sharing it",
			published: map[string][]string{"m1": {"k1"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1"}, Signing: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1"}, Signing: "k1"},
			},
			bundle: []string{"k1"}},
		{name: "a reimaged host publishing its new key",
			published: map[string][]string{"m1": {"k1"}, "m2": {"k3"}},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2", ControllerManagerSigning: "k2"},
			},
			bundle: []string{"k1", "k3"}, stale: []string{"m1", "m2"}},
		{name: "a garbled published value replaces nothing",
			published: map[string][]string{"m1": {"k1"}, "m2": nil},
			pubErr:    map[string]string{"m2": "no PEM block"},
			records: map[string]Record{
				"m1": {Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k1"},
				"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2"},
			},
			bundle: []string{"k1"},
			want:   []string{"m2/k2/kube-apiserver"}, stale: []string{"m2"}},
		{name: "records that name no signing key, or do not parse",
			published: map[string][]string{"m1": {"k1"}},
			records: map[string]Record{
				"m1":  {Host: "m1", Trusted: []string{"k1"}},
				"old": {Host: "old", Unparseable: "unparseable trust record"},
			},
			bundle: []string{"k1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := build(1, tc.published, tc.pubErr, nil, tc.records, nil)
			var got []string
			for _, k := range r.SigningKeysNotIn(tc.bundle) {
				got = append(got, fmt.Sprintf("%s/%s/%s", k.Host, k.Kid, k.Signer))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("keys the bundle %v drops: %v, want %v", tc.bundle, got, tc.want)
			}
			if got := r.Stale(); !slices.Equal(got, tc.stale) {
				t.Errorf("stale hosts %v, want %v", got, tc.stale)
			}
		})
	}
}

// `trust` names a host signing with a key no host publishes, and the key.
func TestTrustReportsAnUnpublishedSigningKey(t *testing.T) {
	r := build(1, map[string][]string{"m1": {"k1"}}, nil, nil, map[string]Record{
		"m1": {Host: "m1", Trusted: []string{"k1", "k2"}, Signing: "k1"},
		"m2": {Host: "m2", Trusted: []string{"k1", "k2"}, Signing: "k2"},
	}, nil)
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"STALE: signs with k2, which no host publishes", "stale hosts: m2"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("trust report lacks %q:\n%s", want, b.String())
		}
	}
}
