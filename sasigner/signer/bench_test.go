package signer

import (
	"context"
	"crypto"
	"encoding/base64"
	"slices"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
	externaljwtv1 "k8s.io/externaljwt/apis/v1"
)

// BenchmarkSignOverSocket measures Sign as kube-apiserver calls it: one
// gRPC call over the Unix socket. It reports the p50 and p99 latency
// (issue 27's targets for p99: ECDSA P-256 under 2 ms, RSA-2048 under 5 ms)
// beside ns/op, whose mean hides the tail the targets are about.
//
//	go test -run '^$' -bench OverSocket -benchtime 2000x ./signer
func BenchmarkSignOverSocket(b *testing.B) {
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"aud":["https://kubernetes.default.svc"],"exp":1767225600,"iat":1767222000,"iss":"https://kubernetes.default.svc","kubernetes.io":{"namespace":"default","serviceaccount":{"name":"probe","uid":"6b3c3c1e-0a4f-4c43-9a3e-3f1f2d3c4b5a"}},"nbf":1767222000,"sub":"system:serviceaccount:default:probe"}`))
	for _, tc := range []struct {
		name string
		key  func(testing.TB) crypto.Signer
	}{
		{"ecdsa-p256", func(t testing.TB) crypto.Signer { return keytest.EC(t) }},
		{"rsa-2048", func(t testing.TB) crypto.Signer { return keytest.RSA(t, 2048) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ks := NewKeySet(nil, mustSigningKey(b, tc.key(b)))
			cli, _ := serveSocket(b, ks, nil)
			ctx := context.Background()
			req := &externaljwtv1.SignJWTRequest{Claims: claims}
			if _, err := cli.Sign(ctx, req); err != nil { // connect before timing
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if _, err := cli.Sign(ctx, req); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
}

// BenchmarkFetchKeysOverSocket: FetchKeys is answered from memory (three
// hosts' RSA-2048 keys and the local ECDSA key), with its p50 and p99.
func BenchmarkFetchKeysOverSocket(b *testing.B) {
	ks := NewKeySet(nil, mustSigningKey(b, keytest.EC(b)))
	for _, h := range []string{"m1", "m2", "m3"} {
		ks.SetHost(h, []Key{keyOf(b, &keytest.RSA(b, 2048).PublicKey)})
	}
	cli, _ := serveSocket(b, ks, nil)
	ctx := context.Background()
	req := &externaljwtv1.FetchKeysRequest{}
	if _, err := cli.FetchKeys(ctx, req); err != nil { // connect before timing
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := cli.FetchKeys(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// reportLatency reports the p50 and p99 of per-call durations, in
// milliseconds, as benchmark metrics.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q int) float64 { return float64(lat[(len(lat)-1)*q/100]) / float64(time.Millisecond) }
	b.ReportMetric(at(50), "p50-ms")
	b.ReportMetric(at(99), "p99-ms")
}

// BenchmarkSignDirect is the signature alone, without gRPC: what the
// socket adds is the difference to BenchmarkSignOverSocket, p99 included
// (on a busy machine both tails are the scheduler's).
func BenchmarkSignDirect(b *testing.B) {
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"system:serviceaccount:default:probe"}`))
	for _, tc := range []struct {
		name string
		key  func(testing.TB) crypto.Signer
	}{
		{"ecdsa-p256", func(t testing.TB) crypto.Signer { return keytest.EC(t) }},
		{"rsa-2048", func(t testing.TB) crypto.Signer { return keytest.RSA(t, 2048) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			k := mustSigningKey(b, tc.key(b))
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				if _, _, err := k.Sign(claims); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
}
