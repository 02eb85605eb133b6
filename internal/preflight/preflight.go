// Package preflight checks kube-apiserver's PEM inputs before a restart, so
// that a broken certificate, key or service-account key bundle stops the
// restart instead of the apiserver.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/keysync/confd/internal/redact"

	"github.com/keysync/confd/internal/pemcheck"
)

var (
	// ErrNoFlags means the flags files named none of the PEM flags preflight
	// knows, which would otherwise make the check a silent no-op.
	ErrNoFlags = errors.New("no kube-apiserver PEM flags found")
	// ErrIgnoredKey marks a key kube-apiserver would skip or refuse.
	ErrIgnoredKey = errors.New("kube-apiserver would not use this key")
	// ErrSigningKeyNotPublished means the apiserver would issue tokens that
	// no --service-account-key-file lets it verify.
	ErrSigningKeyNotPublished = errors.New("service-account signing key is not in any --service-account-key-file")
	ErrNoFiles                = errors.New("no files to check")
	// ErrKeyInValue is a flag whose value is key material instead of a
	// file name; the message never shows the value.
	ErrKeyInValue = errors.New("the value is private key material, not a file name (value not shown); put the key in a file and name that file")
	// ErrRequiredKeyMissing means a bundle lacks a key it must carry.
	ErrRequiredKeyMissing = errors.New("required key is not loaded from the bundle")
	// ErrSigningKeyMode is a service-account signing key others may read.
	ErrSigningKeyMode = errors.New("service-account signing key readable by others or writable by its group")
)

// Input names what to check.
type Input struct {
	Files      []string  // checked generically: parses, >=1 key/cert, certs valid at Now
	FlagsFiles []string  // files parsed for apiserver flags (EnvironmentFile, flag list, manifest)
	Now        time.Time // zero means time.Now()
	// SigningKey is the external signer's signing key file: a flags file
	// naming --service-account-signing-endpoint passes only when the
	// signer serves this key's public half. Unused otherwise.
	SigningKey string
	// Signer asks the signer for its keys and metadata; nil means
	// GRPCFetcher.
	Signer KeyFetcher
	// SignerTimeout bounds that call; zero means DefaultSignerTimeout.
	SignerTimeout time.Duration
	// Warn, if set, is told of problems that must not stop the restart,
	// each naming the file and the block: an RSA service-account key under
	// 2048 bits (pemcheck.ErrWeakKey), which refusing would make the
	// apiserver refuse the live tokens it signed.
	Warn func(error)
}

// Run checks everything and returns nil or an error listing every problem
// found (errors.Join), each naming the file and the reason, and for files
// named by flags, the flag and the flags file and line it came from.
// Flags files are read in order as parts of one command line: a repeated
// scalar flag keeps its last value, as pflag does. A flags file naming
// --service-account-signing-endpoint has no key files to check: the signer
// on that socket is asked for its keys instead (endpoint.go).
func Run(ctx context.Context, in Input) error {
	c := newChecker(in.Now)
	c.warn = in.Warn
	for _, p := range in.Files {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(c.errs, fmt.Errorf("preflight: %w", err))...)
		}
		if f := c.load(p, ""); f != nil {
			c.add("", f.Check(pemcheck.Options{Now: c.now}))
		}
	}
	if len(in.FlagsFiles) > 0 {
		c.checkFlags(ctx, in)
	}
	return errors.Join(c.errs...)
}

// CheckOptions tune CheckFiles.
type CheckOptions struct {
	PublicOnly bool // refuse private keys
	// KeysOnly refuses certificates: a published service-account key must
	// be a key, and a certificate there is a paste of the wrong file.
	KeysOnly bool
	// RequireKeys are PEM files (public or private keys, or certificates)
	// whose public keys every checked file must hold, as kube-apiserver
	// loads them: a bundle without this host's own key must not go live.
	RequireKeys []string
	// OwnKeys are the paths that hold this host's own service-account key
	// (its sa.key or sa.pub): when one of RequireKeys is among them and
	// missing, the error says how the key gets into the bundle (it is
	// published, then confd renders again), not just its key ID.
	OwnKeys []string
	Now     time.Time
	// Warn, if set, is told of what is worth fixing but refuses nothing,
	// each naming the file and the block: an RSA key under 2048 bits
	// (pemcheck.ErrWeakKey). Such a key is already published where check
	// runs on a bundle; failing the check would keep every later bundle
	// from going live, and dropping the key would refuse its live tokens.
	Warn func(error)
}

// CheckFiles is the `kube-apiserver-safe-restart check FILE...` core, meant
// as a confd check_cmd on a staged service-account public-key bundle. Beyond
// parsing and validity, it refuses keys kube-apiserver's
// --service-account-key-file reader would silently skip (PKCS#1 "RSA PUBLIC
// KEY", non-RSA/ECDSA keys): such a bundle would load, and then reject every
// token signed by the skipped key.
//
// A certificate authority's key is refused too (pemcheck.CAs): kube-apiserver
// trusts every key in the bundle, so a CA certificate published beside its
// leaf would let whoever holds the CA's private key mint tokens every
// apiserver accepts (issue 34).
func CheckFiles(ctx context.Context, paths []string, opts CheckOptions) error {
	if len(paths) == 0 {
		return ErrNoFiles
	}
	c := newChecker(opts.Now)
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(c.errs, fmt.Errorf("check: %w", err))...)
		}
		if f := c.load(p, ""); f != nil {
			o := options(roleSAKey, c.now)
			o.ForbidPrivate = opts.PublicOnly
			if opts.KeysOnly {
				o.Allow = pemcheck.PublicKey | pemcheck.PrivateKey
			}
			c.add("", f.Check(o))
			c.add("", c.requireKeys(f, opts.RequireKeys, opts.OwnKeys))
			warn(opts.Warn, f)
		}
	}
	return errors.Join(c.errs...)
}

// warn tells w of f's weak keys.
func warn(w func(error), f *pemcheck.File) {
	if w == nil {
		return
	}
	for _, e := range f.WeakKeys() {
		w(e)
	}
}

// requireKeys checks that f holds, as loaded keys, the public half of every
// key in the files required. Only key IDs (hashes of public keys) are ever
// named: a required file may be this host's private key.
func (c *checker) requireKeys(f *pemcheck.File, required, own []string) error {
	have := map[string]bool{}
	for _, k := range f.APIServerKeys() {
		if id, err := pemcheck.KeyID(k.Public); err == nil {
			have[id] = true
		}
	}
	var errs []error
	for _, r := range required {
		rf := c.load(r, "--require-key")
		if rf == nil {
			continue
		}
		ids, err := rf.KeyIDs()
		if err != nil {
			errs = append(errs, fmt.Errorf("--require-key %s: %w", r, err))
			continue
		}
		isOwn := slices.ContainsFunc(own, func(o string) bool { return o != "" && filepath.Clean(o) == filepath.Clean(r) })
		for _, id := range ids {
			switch {
			case have[id]:
			case isOwn:
				errs = append(errs, fmt.Errorf("%s: %w: this host's own key %s (--require-key %s) is not in the bundle: publish it (`kube-apiserver-safe-restart publish-key`, as sa-key-publish.service runs it) and let confd render again",
					f.Name, ErrRequiredKeyMissing, id, r))
			default:
				errs = append(errs, fmt.Errorf("%s: %w: key ID %s of --require-key %s", f.Name, ErrRequiredKeyMissing, id, r))
			}
		}
	}
	return errors.Join(errs...)
}

type checker struct {
	now   time.Time
	cache map[string]*pemcheck.File // nil for a file that did not load
	errs  []error
	warn  func(error) // Input.Warn
	// warned holds the files warned about, so that a file several flags
	// name is warned about once.
	warned map[string]bool
}

func newChecker(now time.Time) *checker {
	if now.IsZero() {
		now = time.Now()
	}
	return &checker{now: now, cache: map[string]*pemcheck.File{}, warned: map[string]bool{}}
}

// load reads and parses path once. A file several flags name gets its read
// or parse errors reported once, under the first flag.
func (c *checker) load(path, context string) *pemcheck.File {
	if f, ok := c.cache[path]; ok {
		return f
	}
	f, err := pemcheck.ReadFile(path)
	c.cache[path] = f
	c.add(context, err)
	return f
}

// add records err, split into its joined parts so each carries context.
func (c *checker) add(context string, err error) {
	if err == nil {
		return
	}
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	for _, e := range list {
		if context != "" {
			e = fmt.Errorf("%s: %w", context, e)
		}
		c.errs = append(c.errs, e)
	}
}

func (c *checker) use(o occurrence, path string, r role) *pemcheck.File {
	f := c.load(path, o.String())
	if f != nil {
		c.add(o.String(), f.Check(options(r, c.now)))
	}
	return f
}

func (c *checker) checkFlags(ctx context.Context, in Input) {
	specs := apiserverFlags()
	occ, err := readFlags(in.FlagsFiles, specs)
	c.add("", err) // one entry per problem
	if len(occ) == 0 {
		if err == nil {
			c.errs = append(c.errs, fmt.Errorf("%w in %s", ErrNoFlags, strings.Join(in.FlagsFiles, ", ")))
		}
		return
	}
	last := map[string]occurrence{}
	saKeys := map[string]bool{}
	var signing, endpoint *occurrence
	for _, o := range occ {
		if err := ctx.Err(); err != nil {
			c.errs = append(c.errs, fmt.Errorf("preflight: %w", err))
			return
		}
		// A key pasted where a file name belongs: every message below
		// would quote the value ("open -----BEGIN ...: no such file").
		if redact.HasKey(o.value) {
			c.errs = append(c.errs, fmt.Errorf("%s: %w", o, ErrKeyInValue))
			continue
		}
		last[o.flag] = o
		switch r := specs[o.flag].role; r {
		case roleSNI:
			cert, key, err := splitSNI(o.value)
			if err != nil {
				c.add(o.String(), err)
				continue
			}
			cf, kf := c.use(o, cert, roleCert), c.use(o, key, roleKey)
			if cf != nil && kf != nil {
				c.add(o.String(), pemcheck.MatchPair(cf, kf))
			}
		case roleSAKey:
			if f := c.use(o, o.value, r); f != nil {
				if !c.warned[o.value] {
					c.warned[o.value] = true
					warn(c.warn, f)
				}
				for _, k := range f.APIServerKeys() {
					if id, err := pemcheck.KeyID(k.Public); err == nil {
						saKeys[id] = true
					}
				}
			}
		case roleSigningKey:
			if c.use(o, o.value, r) != nil {
				c.add(o.String(), signingKeyMode(o.value))
			}
			signing = &o
		case roleSigningEndpoint:
			if o.value != "" { // empty: unset, as kube-apiserver reads it
				endpoint = &o // a socket, not a PEM file: checked below
			}
		case roleSetting: // not a file
		default:
			c.use(o, o.value, r)
		}
	}
	// Pairs are matched once both halves have been checked on their own.
	// Only a certificate's spec names a key flag.
	for _, o := range occ {
		k, ok := last[specs[o.flag].key]
		if cf, kf := c.cache[o.value], c.cache[k.value]; ok && cf != nil && kf != nil {
			c.add(fmt.Sprintf("%s with %s", o, k), pemcheck.MatchPair(cf, kf))
		}
	}
	if signing != nil && len(saKeys) > 0 {
		c.add(signing.String(), c.signingKeyPublished(signing.value, saKeys))
	}
	if endpoint != nil {
		if err := ctx.Err(); err != nil {
			c.errs = append(c.errs, fmt.Errorf("preflight: %w", err))
			return
		}
		c.checkEndpoint(ctx, *endpoint, occ, in)
	}
}

// signingKeyPublished checks the apiserver can verify the tokens it signs:
// the whole point of distributing every master's public key.
func (c *checker) signingKeyPublished(path string, saKeys map[string]bool) error {
	var key *pemcheck.Block
	if f := c.cache[path]; f != nil {
		key = f.First(pemcheck.PrivateKey)
	}
	if key == nil {
		return nil
	}
	id, err := pemcheck.KeyID(key.Public)
	if err != nil || saKeys[id] {
		return nil
	}
	return fmt.Errorf("%s: %w: its key ID %s is missing, so the apiserver would reject the tokens it issues", path, ErrSigningKeyNotPublished, id)
}

// splitSNI parses --tls-sni-cert-key's certfile,keyfile[:name,...].
func splitSNI(v string) (cert, key string, err error) {
	files, _, _ := strings.Cut(v, ":")
	cert, key, ok := strings.Cut(files, ",")
	cert, key = strings.TrimSpace(cert), strings.TrimSpace(key)
	if !ok || cert == "" || key == "" {
		return "", "", fmt.Errorf("want certfile,keyfile[:names], got %q", v)
	}
	return cert, key, nil
}

// signingKeyMode refuses a signing key that anyone but its owner and group
// may read, or its group may change: whoever reads it can sign tokens every
// apiserver of the fleet accepts. A group may read it (root:kube 0640 for an
// apiserver run as kube); the owner is not checked, since the apiserver's
// user is not known here.
func signingKeyMode(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o027 != 0 {
		return fmt.Errorf("%w: %s has mode %04o: run chmod %04o %s", ErrSigningKeyMode, path, m, m&^0o027, path)
	}
	return nil
}
