// Package tlsconf builds TLS client configurations from the PEM files that
// etcd clients are given on the command line (CA, certificate, key), so
// that confd and kube-apiserver-safe-restart read them the same way.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ErrNoCertificate means a CA file held no PEM certificate.
var ErrNoCertificate = errors.New("no PEM certificate in it")

// Client returns a TLS 1.2+ client configuration. caFile, when set, replaces
// the system roots; certFile and keyFile, when set, are the client's
// certificate. Errors name the file at fault.
func Client(caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: %w", caFile, ErrNoCertificate)
		}
		tc.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s / key %s: %w", certFile, keyFile, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
