package signer

import (
	"context"
	"crypto"
	"fmt"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"google.golang.org/protobuf/proto"

	"github.com/keysync/confd/internal/keytest"
)

// TestFetchKeysAnswerSize pins the size per key of a FetchKeys answer that
// docs/signer.md and docs/performance.md state: kube-apiserver's client
// keeps gRPC's default 4 MiB receive limit, which an answer of about
// 12,000 RSA-2048 or 30,000 P-256 keys reaches.
func TestFetchKeysAnswerSize(t *testing.T) {
	for _, tc := range []struct {
		name         string
		key          func(testing.TB) crypto.Signer
		perKey, keys int // bytes per key; keys under 4 MiB
	}{
		{"rsa-2048", func(t testing.TB) crypto.Signer { return keytest.RSA(t, 2048) }, 345, 12_157},
		{"ecdsa-p256", func(t testing.TB) crypto.Signer { return keytest.EC(t) }, 141, 29_746},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := NewKeySet(nil, nil)
			k := keyOf(t, tc.key(t).Public())
			// One key's size is every key's: the key ID and DER have a fixed
			// length per algorithm.
			size := func() int {
				resp, err := (&Service{Keys: ks, Metrics: NewMetrics()}).FetchKeys(context.Background(), nil)
				if err != nil {
					t.Fatal(err)
				}
				return proto.Size(resp)
			}
			ks.SetHost("h1", []Key{k})
			one := size()
			ks.SetHost("h1", nil)
			empty := size()
			perKey := one - empty
			if perKey != tc.perKey {
				t.Errorf("%d bytes per key, want %d (update the docs' envelope)", perKey, tc.perKey)
			}
			if n := (MaxFetchKeysAnswer - empty) / perKey; n != tc.keys {
				t.Errorf("%d keys fit in 4 MiB, want %d (update the docs' envelope)", n, tc.keys)
			}
		})
	}
}

// TestFetchKeysOverLimit: an answer over 4 MiB is served (a client with a
// larger limit takes it) but logged, once per key set, and its size shown.
func TestFetchKeysOverLimit(t *testing.T) {
	ks := NewKeySet(nil, nil)
	hosts := map[string][]Key{}
	for i := range 12_000 {
		hosts[fmt.Sprintf("h%05d", i)] = []Key{{ID: fmt.Sprintf("k%05d", i), DER: make([]byte, 400)}}
	}
	ks.Replace(hosts)
	logs := &syncBuffer{}
	log := logrus.New()
	log.SetOutput(logs)
	m := NewMetrics()
	svc := &Service{Keys: ks, Log: log, Metrics: m}
	for range 2 {
		if _, err := svc.FetchKeys(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "over kube-apiserver's 4 MiB"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs)
	}
	if n := metricValue(t, m, "kube_apiserver_sa_signer_fetch_keys_response_bytes", "", ""); n <= MaxFetchKeysAnswer {
		t.Errorf("fetch_keys_response_bytes %v, want over %d", n, MaxFetchKeysAnswer)
	}
}
