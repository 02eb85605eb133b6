package preflight

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	externaljwtv1 "k8s.io/externaljwt/apis/v1"

	"github.com/keysync/confd/internal/pemcheck"
)

var (
	// ErrEndpointWithKeyFile is the combination kube-apiserver refuses to
	// start with (pkg/controlplane/apiserver/options/validation.go,
	// validateServiceAccountTokenSigningConfig).
	ErrEndpointWithKeyFile = errors.New("kube-apiserver refuses --service-account-signing-endpoint together with --service-account-key-file or --service-account-signing-key-file (mutually exclusive)")
	// ErrBadEndpoint is an abstract socket name kube-apiserver refuses.
	ErrBadEndpoint = errors.New("not a valid abstract socket name (after @: dot-separated words of letters, digits, _ and -)")
	// ErrSignerUnreachable means the external signer did not answer
	// FetchKeys: the apiserver's first key fill would fail and it would not
	// start.
	ErrSignerUnreachable = errors.New("the external signer does not answer FetchKeys")
	// ErrSignerKeys is a FetchKeys answer kube-apiserver would refuse.
	ErrSignerKeys = errors.New("kube-apiserver would refuse the external signer's key set")
	// ErrSigningKeyNotServed means the apiserver would issue tokens (signed
	// by the signer with --signing-key) that its own key set cannot verify.
	ErrSigningKeyNotServed = errors.New("the external signer does not serve the signing key")
	// ErrSignerMetadata is a Metadata answer (or a flag beside it) that
	// kube-apiserver refuses to start with.
	ErrSignerMetadata = errors.New("kube-apiserver would refuse the external signer's metadata")
	// ErrNoSigningKey means there is no key to look for in the signer's set.
	ErrNoSigningKey = errors.New("no signing key to look for in the external signer's key set (give --signing-key, the signer's key file)")
)

// DefaultSignerTimeout bounds the FetchKeys call: a signer answers from
// memory in well under a millisecond, so a few seconds means it is hung.
const DefaultSignerTimeout = 5 * time.Second

// KeyFetcher asks the external signer listening at endpoint (the value of
// --service-account-signing-endpoint) what kube-apiserver asks it at start:
// its key set, then its metadata. A small interface so that callers and
// tests may replace the gRPC client.
type KeyFetcher interface {
	FetchKeys(ctx context.Context, endpoint string) (*externaljwtv1.FetchKeysResponse, error)
	Metadata(ctx context.Context, endpoint string) (*externaljwtv1.MetadataResponse, error)
}

// abstractSocket is kube-apiserver's rule for an endpoint starting with @
// (validation.go: abstractSocketRegex).
var abstractSocket = regexp.MustCompile(`^@([a-zA-Z0-9_-]+\.)*[a-zA-Z0-9_-]+$`)

// GRPCFetcher calls ExternalJWTSigner.FetchKeys the way kube-apiserver's
// external signer plugin does (pkg/serviceaccount/externaljwt/plugin):
// the endpoint is a Unix socket path (a leading @ names an abstract
// socket), plaintext, authority "localhost". Unlike the apiserver it does
// not wait for the signer to become ready: a socket nobody serves is the
// answer preflight is looking for.
type GRPCFetcher struct{}

// FetchKeys dials endpoint, calls FetchKeys once and closes the connection.
func (GRPCFetcher) FetchKeys(ctx context.Context, endpoint string) (*externaljwtv1.FetchKeysResponse, error) {
	return callSigner(endpoint, func(c externaljwtv1.ExternalJWTSignerClient) (*externaljwtv1.FetchKeysResponse, error) {
		return c.FetchKeys(ctx, &externaljwtv1.FetchKeysRequest{})
	})
}

// Metadata dials endpoint, calls Metadata once and closes the connection.
func (GRPCFetcher) Metadata(ctx context.Context, endpoint string) (*externaljwtv1.MetadataResponse, error) {
	return callSigner(endpoint, func(c externaljwtv1.ExternalJWTSignerClient) (*externaljwtv1.MetadataResponse, error) {
		return c.Metadata(ctx, &externaljwtv1.MetadataRequest{})
	})
}

// callSigner runs call on a connection to the signer at endpoint.
func callSigner[T any](endpoint string, call func(externaljwtv1.ExternalJWTSignerClient) (T, error)) (T, error) {
	// passthrough hands the path to the dialer unchanged (the default
	// resolver would look it up in DNS).
	conn, err := grpc.NewClient("passthrough:///"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, path string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}))
	if err != nil {
		var zero T
		return zero, fmt.Errorf("gRPC client: %w", err)
	}
	defer func() { _ = conn.Close() }()
	return call(externaljwtv1.NewExternalJWTSignerClient(conn))
}

// checkEndpoint checks a flags file naming an external signer: no key-file
// flag beside it, and a signer that answers FetchKeys with a key set the
// apiserver accepts and that holds the signing key's public half.
func (c *checker) checkEndpoint(ctx context.Context, ep occurrence, occ []occurrence, in Input) {
	specs := apiserverFlags()
	for _, o := range occ {
		if r := specs[o.flag].role; r == roleSAKey || r == roleSigningKey {
			c.errs = append(c.errs, fmt.Errorf("%s with %s: %w", ep, o, ErrEndpointWithKeyFile))
		}
	}
	if strings.HasPrefix(ep.value, "@") && !abstractSocket.MatchString(ep.value) {
		c.errs = append(c.errs, fmt.Errorf("%s: %q: %w", ep, ep.value, ErrBadEndpoint))
		return
	}
	if in.SigningKey == "" {
		c.errs = append(c.errs, fmt.Errorf("%s: %w", ep, ErrNoSigningKey))
		return
	}
	f := c.load(in.SigningKey, "--signing-key")
	if f == nil {
		return
	}
	if err := f.Check(options(roleSigningKey, c.now)); err != nil {
		c.add("--signing-key", err)
		return
	}
	key := f.First(pemcheck.PrivateKey)
	if key == nil {
		return // Check required a private key and reported its absence
	}
	id, err := pemcheck.KeyID(key.Public)
	if err != nil {
		c.add("--signing-key "+in.SigningKey, err)
		return
	}
	der, _ := x509.MarshalPKIXPublicKey(key.Public) // KeyID marshalled it already
	fetcher, timeout := cmp.Or[KeyFetcher](in.Signer, GRPCFetcher{}), cmp.Or(in.SignerTimeout, DefaultSignerTimeout)
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := fetcher.FetchKeys(fctx, ep.value)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w at %s (waited at most %s): %w", ep, ErrSignerUnreachable, ep.value, timeout, err))
		return
	}
	if err := acceptedKeySet(resp); err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w: %w", ep, ErrSignerKeys, err))
		return
	}
	if err := servesSigningKey(resp, id, der); err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w: key ID %s of --signing-key %s %w", ep, ErrSigningKeyNotServed, id, in.SigningKey, err))
	}
	// The apiserver asks for the metadata right after its first key fill.
	mctx, mcancel := context.WithTimeout(ctx, timeout)
	defer mcancel()
	md, err := fetcher.Metadata(mctx, ep.value)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w at %s (Metadata, waited at most %s): %w", ep, ErrSignerUnreachable, ep.value, timeout, err))
		return
	}
	c.errs = append(c.errs, acceptedMetadata(ep, md, occ)...)
}

// servesSigningKey says why the key set does not hold the signing key's
// public half (key ID id, PKIX DER der), or nil.
func servesSigningKey(resp *externaljwtv1.FetchKeysResponse, id string, der []byte) error {
	for _, k := range resp.GetKeys() {
		if k.GetKeyId() == id {
			if bytes.Equal(k.GetKey(), der) {
				return nil
			}
			return errors.New("is served with another public key")
		}
	}
	return fmt.Errorf("is not among the %d keys it serves, so the apiserver would reject the tokens it issues", len(resp.GetKeys()))
}

// minTokenAgeSec is kube-apiserver's validation.MinTokenAgeSec (600).
const minTokenAgeSec = 600

// acceptedMetadata applies kube-apiserver's checks on the signer's
// Metadata at start (pkg/controlplane/apiserver/options/options.go,
// Complete): a max token expiration of at least 600 s, and no
// --service-account-max-token-expiration beyond it.
func acceptedMetadata(ep occurrence, md *externaljwtv1.MetadataResponse, occ []occurrence) []error {
	maxSec := md.GetMaxTokenExpirationSeconds()
	if maxSec < minTokenAgeSec {
		return []error{fmt.Errorf("%s: %w: max_token_expiration_seconds %d is less than the %d s the apiserver accepts", ep, ErrSignerMetadata, maxSec, minTokenAgeSec)}
	}
	var errs []error
	for _, o := range occ {
		if o.flag != "service-account-max-token-expiration" {
			continue
		}
		// pflag's Duration, as the apiserver parses it.
		d, err := time.ParseDuration(o.value)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
			continue
		}
		if limit := time.Duration(maxSec) * time.Second; d > limit {
			errs = append(errs, fmt.Errorf("%s %s is longer than the %s the external signer supports (%s): %w", o, d, limit, ep, ErrSignerMetadata))
		}
	}
	return errs
}

// acceptedKeySet applies the checks kube-apiserver makes on every FetchKeys
// answer (pkg/serviceaccount/externaljwt/plugin/keycache.go,
// getTokenVerificationKeys); an answer failing one stops its start.
func acceptedKeySet(resp *externaljwtv1.FetchKeysResponse) error {
	if h := resp.GetRefreshHintSeconds(); h <= 0 {
		return fmt.Errorf("refresh_hint_seconds %d, want > 0", h)
	}
	if len(resp.GetKeys()) == 0 {
		return errors.New("no keys")
	}
	if err := resp.GetDataTimestamp().CheckValid(); err != nil {
		return fmt.Errorf("data_timestamp: %w", err)
	}
	for i, k := range resp.GetKeys() {
		switch {
		case k == nil:
			return fmt.Errorf("key %d is nil", i)
		case len(k.GetKeyId()) == 0 || len(k.GetKeyId()) > 1024:
			return fmt.Errorf("key %d: key ID of %d bytes, want 1 to 1024", i, len(k.GetKeyId()))
		case len(k.GetKey()) == 0:
			return fmt.Errorf("key %d (%s): empty", i, k.GetKeyId())
		}
		if _, err := x509.ParsePKIXPublicKey(k.GetKey()); err != nil {
			return fmt.Errorf("key %d (%s): %w", i, k.GetKeyId(), err)
		}
	}
	return nil
}
