package redact

import (
	"strings"
	"testing"
)

// BenchmarkStringLogRecord is the cost the log formatter adds per record.
func BenchmarkStringLogRecord(b *testing.B) {
	rec := "2026-12-01T02:00:00Z host confd[42]: INFO Target config /etc/kubernetes/pki/sa-bundle.pem has been updated resource=/etc/confd/conf.d/10-sa-bundle.toml\n"
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = String(rec)
	}
}

// BenchmarkStringKeyOutput masks 64 KiB of command output holding keys.
func BenchmarkStringKeyOutput(b *testing.B) {
	block := "+-----BEGIN RSA PRIVATE KEY-----\n" + strings.Repeat("+"+strings.Repeat("A", 64)+"\n", 25) + "+-----END RSA PRIVATE KEY-----\n"
	out := strings.Repeat(block, 64*1024/len(block))
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = String(out)
	}
}
