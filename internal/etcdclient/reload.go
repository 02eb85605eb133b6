package etcdclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"
)

// tlsFiles builds the TLS configuration of every new connection from the
// CA, certificate and key files as they are on disk now, so that a renewed
// certificate (or a rotated CA) is used without a restart. The files are
// parsed again only when one of them changed (size, mtime, inode); a
// half-finished renewal (a certificate that does not match its key yet)
// keeps the last good configuration. It is the connection's gRPC
// transport credentials: every handshake takes a fresh configuration.
type tlsFiles struct {
	files Config // its TLS files and ClientInsecure
	now   func() time.Time
	info  credentials.ProtocolInfo

	mu    sync.Mutex
	stamp string
	tc    *tls.Config
}

func newTLSFiles(cfg Config, initial *tls.Config) *tlsFiles {
	f := &tlsFiles{files: cfg, now: time.Now, info: credentials.NewTLS(initial).Info(), tc: initial}
	f.stamp = f.currentStamp()
	return f
}

func (f *tlsFiles) currentStamp() string {
	var s string
	for _, p := range []string{f.files.ClientCAKeys, f.files.ClientCert, f.files.ClientKey} {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			s += p + ":missing;"
			continue
		}
		var ino uint64
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			ino = st.Ino
		}
		s += fmt.Sprintf("%s:%d:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano(), ino)
	}
	return s
}

// config is the configuration for the next handshake.
func (f *tlsFiles) config() (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if stamp := f.currentStamp(); stamp != f.stamp {
		// On an error, keep the last good files until the renewal is complete.
		if tc, err := clientTLS(f.files); err == nil {
			f.tc, f.stamp = tc, stamp
		}
	}
	var leaf *x509.Certificate
	if len(f.tc.Certificates) > 0 {
		leaf = f.tc.Certificates[0].Leaf // parsed by tls.LoadX509KeyPair since Go 1.23
	}
	if err := validity(f.files.ClientCert, leaf, f.now()); err != nil {
		return nil, err
	}
	return f.tc.Clone(), nil
}

// validity reports a client certificate outside its validity period by
// name: etcd would only answer "bad certificate".
func validity(file string, leaf *x509.Certificate, now time.Time) error {
	if leaf == nil {
		return nil
	}
	switch {
	case now.After(leaf.NotAfter):
		return &ExpiredError{File: file, NotAfter: leaf.NotAfter}
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("client certificate %s is not valid before %s (clock skew?)", file, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// ExpiredError is a client certificate past its validity period. Its
// message is for a running client, which reads the file again on its next
// connection; a program that cannot start says so itself (errors.As).
type ExpiredError struct {
	File     string
	NotAfter time.Time
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("client certificate %s expired at %s (renew it on disk: confd reads it again on the next connection)", e.File, e.NotAfter.UTC().Format(time.RFC3339))
}

// CertificateProblem reports the client certificate file of cfg when it
// cannot be read or is outside its validity period; nil otherwise.
func CertificateProblem(cfg Config) error {
	if cfg.ClientCert == "" {
		return nil
	}
	b, err := os.ReadFile(cfg.ClientCert)
	if err != nil {
		return fmt.Errorf("client certificate: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return fmt.Errorf("client certificate %s: no PEM block", cfg.ClientCert)
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("client certificate %s: %w", cfg.ClientCert, err)
	}
	return validity(cfg.ClientCert, leaf, time.Now())
}

// Diagnose names why cfg's endpoints cannot be used right now: a client
// certificate expired or unreadable, an endpoint unreachable, a refused
// handshake. nil means nothing found.
func Diagnose(ctx context.Context, cfg Config) error {
	if err := CertificateProblem(cfg); err != nil {
		return err
	}
	eps, tc, err := resolve(ctx, cfg)
	if err != nil {
		return err
	}
	return diagnose(ctx, cfg, eps, tc)
}

// resolve returns cfg's endpoints and their TLS configuration.
func resolve(ctx context.Context, cfg Config) ([]string, *tls.Config, error) {
	eps, err := endpoints(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	tc, err := tlsConfig(cfg, eps)
	return eps, tc, err
}

func (f *tlsFiles) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, err := f.config()
	if err != nil {
		return nil, nil, err
	}
	return credentials.NewTLS(tc).ClientHandshake(ctx, authority, raw)
}

func (f *tlsFiles) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("etcdclient: client credentials only")
}

func (f *tlsFiles) Info() credentials.ProtocolInfo { return f.info }

// Clone shares f: its files, and the configuration last read from them,
// are the same for every copy.
func (f *tlsFiles) Clone() credentials.TransportCredentials { return f }

//nolint:staticcheck // part of the interface
func (f *tlsFiles) OverrideServerName(string) error { return nil }
