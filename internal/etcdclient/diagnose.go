package etcdclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// diagnose finds out why endpoints gave no answer, for New's error: gRPC
// reports only "context deadline exceeded" (or "broken pipe" when the server
// refuses a client certificate after a TLS 1.3 handshake). It connects to
// each endpoint itself, speaking just enough TLS and HTTP/2 to get a verdict,
// and returns nil when every endpoint looks fine.
func diagnose(ctx context.Context, cfg Config, eps []string, tc *tls.Config) error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			if err := probe(ctx, cfg, ep, tc); err != nil {
				errs[i] = fmt.Errorf("%s: %w", ep, err)
			}
		})
	}
	wg.Wait()
	if found := endpointErrors(slices.DeleteFunc(errs, func(err error) bool { return err == nil })); len(found) > 0 {
		return found
	}
	return nil
}

// endpointErrors is errors.Join on one line, which suits log lines better.
type endpointErrors []error

func (e endpointErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e endpointErrors) Unwrap() []error { return e }

// http2Preface is a client connection preface and an empty SETTINGS frame:
// an etcd server answers it with its own SETTINGS frame.
var http2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

func probe(ctx context.Context, cfg Config, ep string, tc *tls.Config) error {
	u, err := url.Parse(ep)
	if err != nil {
		return err
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Errorf("unreachable: %w", err)
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	conn := raw
	if u.Scheme == "https" {
		c := tc.Clone()
		if c.ServerName == "" {
			c.ServerName = u.Hostname()
		}
		t := tls.Client(raw, c)
		if err := t.HandshakeContext(ctx); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("TLS handshake failed, server closed the connection (does it serve plain http?): %w", err)
			}
			var unknownCA x509.UnknownAuthorityError
			if errors.As(err, &unknownCA) {
				return fmt.Errorf("TLS handshake failed: %w (%s)", err, untrustedServer(cfg))
			}
			return fmt.Errorf("TLS handshake failed: %w", err)
		}
		conn = t
	}
	if _, err := conn.Write(http2Preface); err != nil {
		return refused(u.Scheme, err)
	}
	buf := make([]byte, 9)
	n, err := conn.Read(buf)
	var ne net.Error
	switch {
	case n >= 4 && buf[3] == 0x4: // a SETTINGS frame: an HTTP/2 server
		return nil
	case n > 0 && (buf[0] == 0x15 || buf[0] == 0x16): // a TLS record
		return errors.New("server speaks TLS: use an https:// node or TLS flags")
	case n > 0:
		return fmt.Errorf("not an etcd client port (answered %q)", bytes.ToValidUTF8(buf[:n], []byte("?")))
	case errors.As(err, &ne) && ne.Timeout():
		return nil // slow, not broken: nothing to add to the caller's error
	default:
		return refused(u.Scheme, err)
	}
}

// untrustedServer says which CAs refused etcd's server certificate and
// which setting gives the right one: "unknown authority" alone leaves the
// operator to guess whether a CA file was read at all, and which.
func untrustedServer(cfg Config) string {
	if cfg.ClientCAKeys == "" {
		return fmt.Sprintf("checked against the system roots, as no %s is given: give the CA that signs etcd's server certificate with %s (kubeadm's is /etc/kubernetes/pki/etcd/ca.crt)",
			cfg.caSetting(), cfg.caSetting())
	}
	return fmt.Sprintf("checked against CA file %s, given by %s: it does not hold the CA that signs etcd's server certificate; give that CA's file with %s (kubeadm's is /etc/kubernetes/pki/etcd/ca.crt)",
		cfg.ClientCAKeys, cfg.caSetting(), cfg.caSetting())
}

// refused explains a connection the server closed after accepting it.
func refused(scheme string, err error) error {
	if scheme == "https" {
		// With TLS 1.3 the server checks the client certificate after
		// the handshake, so its refusal shows up here.
		if strings.Contains(err.Error(), "tls:") {
			return fmt.Errorf("TLS refused by server (client certificate missing or not trusted by etcd?): %w", err)
		}
		return fmt.Errorf("connection closed by server after TLS handshake (client certificate missing or not trusted by etcd?): %w", err)
	}
	return fmt.Errorf("connection closed by server (does it expect TLS?): %w", err)
}
