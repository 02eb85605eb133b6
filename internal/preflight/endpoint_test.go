package preflight

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/timestamppb"
	externaljwtv1 "k8s.io/externaljwt/apis/v1"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/sasigner/signer"
)

// socketDir is a short temporary directory: Unix socket paths are limited
// to ~108 bytes, and t.TempDir can be longer.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "preflight")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// serveSigner runs the project's own signer on a temporary socket: it
// signs with sign and serves its public half and the other hosts' keys.
func serveSigner(t *testing.T, sign *ecdsa.PrivateKey, others ...crypto.PublicKey) string {
	t.Helper()
	sk, err := signer.NewSigningKey(sign)
	if err != nil {
		t.Fatal(err)
	}
	ks := signer.NewKeySet(nil, sk)
	for i, pub := range others {
		keys, err := signer.ParsePublished("other", keytest.PublicPEM(t, pub), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		ks.SetHosts(map[string][]signer.Key{"m" + string(rune('2'+i)): keys})
	}
	path := filepath.Join(socketDir(t), "run", "signer.sock")
	l, err := signer.Listen(context.Background(), path, -1)
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	g := signer.NewGRPCServer(&signer.Service{Keys: ks, RefreshHint: 10 * time.Second, MaxTokenExpiration: time.Hour, Log: log, Metrics: signer.NewMetrics()})
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return path
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSigningEndpointOverSocket: a flags file naming the endpoint passes
// only when the signer on that socket answers FetchKeys with the signing
// key's public half among its keys.
func TestSigningEndpointOverSocket(t *testing.T) {
	self, other := keytest.EC(t), keytest.EC(t)
	selfID, err := pemcheck.KeyID(&self.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	saKey := writeFile(t, dir, "sa.key", keytest.SEC1PEM(t, self))
	serving := serveSigner(t, self, &other.PublicKey)
	// A signer signing with another key: this host's key is not served.
	wrong := serveSigner(t, other, &keytest.RSA(t, 1024).PublicKey)
	// A socket file whose signer died (SIGKILL leaves it behind).
	stale := filepath.Join(socketDir(t), "stale.sock")
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = sl.Close()
	// A process that accepts connections and never answers: hung.
	hungPath := filepath.Join(socketDir(t), "hung.sock")
	hung, err := net.Listen("unix", hungPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hung.Close() })
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()

	tests := []struct {
		name     string
		endpoint string
		timeout  time.Duration
		err      error
		text     []string
	}{
		{name: "serves the signing key", endpoint: serving},
		{name: "signing key not served", endpoint: wrong, err: ErrSigningKeyNotServed, text: []string{selfID, saKey}},
		{name: "no socket", endpoint: filepath.Join(dir, "missing.sock"), err: ErrSignerUnreachable},
		{name: "stale socket", endpoint: stale, err: ErrSignerUnreachable},
		{name: "hung signer", endpoint: hungPath, timeout: 200 * time.Millisecond, err: ErrSignerUnreachable, text: []string{"200ms"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			flags := writeFile(t, t.TempDir(), "kube-apiserver.yaml", []byte("spec:\n  containers:\n  - command:\n    - kube-apiserver\n    - --service-account-issuer=https://kubernetes.default.svc\n    - --service-account-signing-endpoint="+tc.endpoint+"\n"))
			err := Run(context.Background(), Input{FlagsFiles: []string{flags}, SigningKey: saKey, SignerTimeout: tc.timeout})
			if tc.err == nil {
				if err != nil {
					t.Fatalf("want no error, got %v", err)
				}
				return
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("want %v, got %v", tc.err, err)
			}
			// The message names the flag and the file and line it is on.
			for _, want := range append([]string{"--service-account-signing-endpoint (" + flags + ":6)"}, tc.text...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
}

// fakeFetcher answers FetchKeys with resp and err, records the endpoints
// asked, and answers Metadata with md (nil: one hour) and mdErr.
type fakeFetcher struct {
	resp  *externaljwtv1.FetchKeysResponse
	err   error
	asked []string
	md    *externaljwtv1.MetadataResponse
	mdErr error
}

func (f *fakeFetcher) Metadata(context.Context, string) (*externaljwtv1.MetadataResponse, error) {
	if f.md == nil && f.mdErr == nil {
		return &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 3600}, nil
	}
	return f.md, f.mdErr
}

func (f *fakeFetcher) FetchKeys(_ context.Context, endpoint string) (*externaljwtv1.FetchKeysResponse, error) {
	f.asked = append(f.asked, endpoint)
	return f.resp, f.err
}

func goodSet(t *testing.T, pubs ...crypto.PublicKey) *externaljwtv1.FetchKeysResponse {
	t.Helper()
	resp := &externaljwtv1.FetchKeysResponse{DataTimestamp: timestamppb.Now(), RefreshHintSeconds: 10}
	for _, pub := range pubs {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		id, err := pemcheck.KeyID(pub)
		if err != nil {
			t.Fatal(err)
		}
		resp.Keys = append(resp.Keys, &externaljwtv1.Key{KeyId: id, Key: der})
	}
	return resp
}

// TestSigningEndpointFlags pins kube-apiserver v1.37.2's rules for the
// endpoint flag (pkg/controlplane/apiserver/options: options.go registers
// it as a string flag, last one wins; validation.go's
// validateServiceAccountTokenSigningConfig refuses it beside either key-file
// flag and checks an @ abstract socket name; its cases are in
// validation_test.go TestValidateServiceAccountTokenSigningConfig).
func TestSigningEndpointFlags(t *testing.T) {
	self := keytest.EC(t)
	dir := t.TempDir()
	saKey := writeFile(t, dir, "sa.key", keytest.SEC1PEM(t, self))
	saPub := writeFile(t, dir, "sa.pub", keytest.PublicPEM(t, &self.PublicKey))
	tests := []struct {
		name  string
		flags string
		asked []string // endpoints FetchKeys was called with
		errs  []error  // one per error expected
		text  []string
	}{
		{
			name:  "endpoint alone",
			flags: "--service-account-signing-endpoint=/run/s/signer.sock\n",
			asked: []string{"/run/s/signer.sock"},
		},
		{
			name:  "signing key file with endpoint",
			flags: "--service-account-signing-endpoint=@ebc.eng.hij\n--service-account-signing-key-file={sa.key}\n",
			asked: []string{"@ebc.eng.hij"},
			errs:  []error{ErrEndpointWithKeyFile},
			text:  []string{"--service-account-signing-endpoint (%:1) with --service-account-signing-key-file (%:2)"},
		},
		{
			name:  "key files with endpoint, one error each",
			flags: "--service-account-key-file={sa.pub}\n--service-account-key-file={sa.pub}\n--service-account-signing-endpoint=@ebc.eng.hij\n",
			asked: []string{"@ebc.eng.hij"},
			errs:  []error{ErrEndpointWithKeyFile, ErrEndpointWithKeyFile},
			text:  []string{"with --service-account-key-file (%:1)", "with --service-account-key-file (%:2)"},
		},
		{
			name:  "both key-file flags with endpoint",
			flags: `KUBE_API_ARGS="--service-account-key-file={sa.pub} --service-account-signing-key-file={sa.key} --service-account-signing-endpoint /run/s/signer.sock"` + "\n",
			asked: []string{"/run/s/signer.sock"},
			errs:  []error{ErrEndpointWithKeyFile, ErrEndpointWithKeyFile},
		},
		{
			name:  "relative endpoint",
			flags: "--service-account-signing-endpoint=abc\n",
			asked: []string{"abc"},
		},
		{
			name:  "invalid abstract socket name",
			flags: "--service-account-signing-endpoint=@abc@\n",
			errs:  []error{ErrBadEndpoint},
			text:  []string{`"@abc@"`},
		},
		{
			name:  "invalid abstract socket name 2",
			flags: "--service-account-signing-endpoint=@abc.\n",
			errs:  []error{ErrBadEndpoint},
		},
		{
			name:  "valid abstract socket name",
			flags: "--service-account-signing-endpoint=@a_b-c.d1\n",
			asked: []string{"@a_b-c.d1"},
		},
		{
			name:  "last value wins; underscores normalised",
			flags: "--service-account-signing-endpoint=/old.sock\n--service_account_signing_endpoint=/new.sock\n",
			asked: []string{"/new.sock"},
		},
		{
			name:  "static pod manifest, value as the next word",
			flags: "    - --service-account-signing-endpoint\n    - /etc/kubernetes/signer/signer.sock\n",
			asked: []string{"/etc/kubernetes/signer/signer.sock"},
		},
		{
			// kube-apiserver v1.37.2 reads an empty value as unset:
			// pkg/controlplane/apiserver/options/validation.go returns
			// early on len(ServiceAccountSigningEndpoint) == 0, and
			// options.go's Complete picks the signer only when it is != "".
			name:  "empty endpoint is unset",
			flags: "--service-account-key-file={sa.pub}\n--service-account-signing-key-file={sa.key}\n--service-account-signing-endpoint=\n",
		},
		{
			name:  "empty endpoint last: unset",
			flags: "--service-account-signing-endpoint=/run/s/signer.sock\n--service-account-key-file={sa.pub}\n--service-account-signing-key-file={sa.key}\n--service-account-signing-endpoint=\n",
		},
		{
			name:  "bundle mode is not asked",
			flags: "--service-account-key-file={sa.pub}\n--service-account-signing-key-file={sa.key}\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.NewReplacer("{sa.key}", saKey, "{sa.pub}", saPub).Replace(tc.flags)
			flags := writeFile(t, t.TempDir(), "apiserver.env", []byte(body))
			f := &fakeFetcher{resp: goodSet(t, &self.PublicKey)}
			err := Run(context.Background(), Input{FlagsFiles: []string{flags}, SigningKey: saKey, Signer: f})
			if !slices.Equal(f.asked, tc.asked) {
				t.Errorf("FetchKeys asked %q, want %q", f.asked, tc.asked)
			}
			got := splitJoined(err)
			if len(got) != len(tc.errs) {
				t.Fatalf("got %d errors, want %d: %v", len(got), len(tc.errs), err)
			}
			for i, want := range tc.errs {
				if !errors.Is(got[i], want) {
					t.Errorf("error %d: got %v, want %v", i, got[i], want)
				}
			}
			for _, want := range tc.text {
				if want = strings.ReplaceAll(want, "%", flags); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v does not say %q", err, want)
				}
			}
		})
	}
}

func splitJoined(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// TestSigningEndpointKeySet: answers kube-apiserver would refuse at start
// (pkg/serviceaccount/externaljwt/plugin/keycache.go,
// getTokenVerificationKeys), and a set that lacks or misplaces the key.
func TestSigningEndpointKeySet(t *testing.T) {
	self, other := keytest.EC(t), keytest.EC(t)
	dir := t.TempDir()
	saKey := writeFile(t, dir, "sa.key", keytest.SEC1PEM(t, self))
	flags := writeFile(t, dir, "flags", []byte("--service-account-signing-endpoint=/run/s/signer.sock\n"))
	selfID, err := pemcheck.KeyID(&self.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(r *externaljwtv1.FetchKeysResponse)
		err  error
		text string
	}{
		{name: "good", edit: func(*externaljwtv1.FetchKeysResponse) {}},
		{name: "no data timestamp", edit: func(r *externaljwtv1.FetchKeysResponse) { r.DataTimestamp = nil }, err: ErrSignerKeys, text: "data_timestamp"},
		{name: "no refresh hint", edit: func(r *externaljwtv1.FetchKeysResponse) { r.RefreshHintSeconds = 0 }, err: ErrSignerKeys, text: "refresh_hint_seconds 0"},
		{name: "no keys", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys = nil }, err: ErrSignerKeys, text: "no keys"},
		{name: "empty key ID", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys[1].KeyId = "" }, err: ErrSignerKeys},
		{name: "key ID too long", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys[1].KeyId = strings.Repeat("k", 1025) }, err: ErrSignerKeys},
		{name: "nil key", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys[1] = nil }, err: ErrSignerKeys},
		{name: "empty key", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys[1].Key = nil }, err: ErrSignerKeys},
		{name: "not PKIX", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys[1].Key = []byte("junk") }, err: ErrSignerKeys},
		{name: "signing key missing", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys = r.Keys[1:] }, err: ErrSigningKeyNotServed, text: selfID},
		{name: "another key under its ID", edit: func(r *externaljwtv1.FetchKeysResponse) { r.Keys[0].Key = r.Keys[1].Key }, err: ErrSigningKeyNotServed, text: "another public key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := goodSet(t, &self.PublicKey, &other.PublicKey)
			tc.edit(resp)
			err := Run(context.Background(), Input{FlagsFiles: []string{flags}, SigningKey: saKey, Signer: &fakeFetcher{resp: resp}})
			if tc.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), flags+":1") {
				t.Fatalf("got %v, want %v saying %q and naming %s:1", err, tc.err, tc.text, flags)
			}
		})
	}
}

// TestSigningEndpointSigningKey: without a usable --signing-key there is
// nothing to look for, and the signer is not asked.
func TestSigningEndpointSigningKey(t *testing.T) {
	dir := t.TempDir()
	flags := writeFile(t, dir, "flags", []byte("--service-account-signing-endpoint=/run/s/signer.sock\n"))
	pub := writeFile(t, dir, "sa.pub", keytest.PublicPEM(t, &keytest.EC(t).PublicKey))
	for _, tc := range []struct {
		name, key string
		err       error
	}{
		{"none", "", ErrNoSigningKey},
		{"missing file", filepath.Join(dir, "absent.key"), os.ErrNotExist},
		{"public key only", pub, pemcheck.ErrMissingKind},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeFetcher{resp: goodSet(t, &keytest.EC(t).PublicKey)}
			err := Run(context.Background(), Input{FlagsFiles: []string{flags}, SigningKey: tc.key, Signer: f})
			if !errors.Is(err, tc.err) {
				t.Fatalf("got %v, want %v", err, tc.err)
			}
			if len(f.asked) > 0 {
				t.Errorf("the signer was asked (%q) with no key to look for", f.asked)
			}
		})
	}
}

// TestSigningEndpointMetadata pins kube-apiserver v1.37.2's checks on the
// signer's Metadata at start (pkg/controlplane/apiserver/options/options.go,
// Complete): max_token_expiration_seconds below validation.MinTokenAgeSec
// (600) stops it, and so does --service-account-max-token-expiration set
// longer than the signer's maximum (equal is accepted).
func TestSigningEndpointMetadata(t *testing.T) {
	self := keytest.EC(t)
	dir := t.TempDir()
	saKey := writeFile(t, dir, "sa.key", keytest.SEC1PEM(t, self))
	for _, tc := range []struct {
		name   string
		extra  string
		md     *externaljwtv1.MetadataResponse
		mdErr  error
		errs   []error
		saying string
	}{
		{name: "an hour, no flag", md: &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 3600}},
		{name: "exactly 600 s", md: &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 600}},
		{name: "599 s", md: &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 599},
			errs: []error{ErrSignerMetadata}, saying: "max_token_expiration_seconds 599"},
		{name: "flag equal to the signer's", extra: "--service-account-max-token-expiration=1h\n",
			md: &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 3600}},
		{name: "flag longer than the signer's", extra: "--service-account-max-token-expiration=2h\n",
			md:   &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 3600},
			errs: []error{ErrSignerMetadata}, saying: "--service-account-max-token-expiration (%:2) 2h0m0s is longer than the 1h0m0s"},
		{name: "last flag wins", extra: "--service-account-max-token-expiration=2h\n--service-account-max-token-expiration=30m\n",
			md: &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: 3600}},
		{name: "flag not a duration", extra: "--service-account-max-token-expiration=forever\n",
			errs: []error{nil}, saying: "--service-account-max-token-expiration (%:2)"},
		{name: "Metadata fails", mdErr: errors.New("unimplemented"),
			errs: []error{ErrSignerUnreachable}, saying: "Metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := writeFile(t, t.TempDir(), "apiserver.env", []byte("--service-account-signing-endpoint=/run/s/signer.sock\n"+tc.extra))
			f := &fakeFetcher{resp: goodSet(t, &self.PublicKey), md: tc.md, mdErr: tc.mdErr}
			err := Run(context.Background(), Input{FlagsFiles: []string{flags}, SigningKey: saKey, Signer: f})
			got := splitJoined(err)
			if len(got) != len(tc.errs) {
				t.Fatalf("got %d errors, want %d: %v", len(got), len(tc.errs), err)
			}
			for i, want := range tc.errs {
				if want != nil && !errors.Is(got[i], want) {
					t.Errorf("error %d: got %v, want %v", i, got[i], want)
				}
			}
			if want := strings.ReplaceAll(tc.saying, "%", flags); want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
				t.Errorf("error %v does not say %q", err, want)
			}
		})
	}
}
