package pemcheck

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
)

func TestCheck(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ek := keytest.EC(t)
	rk := keytest.RSA(t, 1024)
	valid := keytest.CertPEM(t, ek, "valid", now.Add(-time.Hour), now.Add(time.Hour))
	expired := keytest.CertPEM(t, ek, "old", now.Add(-2*time.Hour), now.Add(-time.Hour))
	future := keytest.CertPEM(t, ek, "future", now.Add(time.Hour), now.Add(2*time.Hour))
	pub := keytest.PublicPEM(t, &rk.PublicKey)
	priv := keytest.PKCS1PEM(rk)
	params := keytest.Encode("EC PARAMETERS", []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7})
	errRejected := errors.New("rejected by validator")

	tests := []struct {
		name string
		data []byte
		opts Options
		errs []error // sentinels the result must wrap; none means nil
		text []string
	}{
		{name: "valid cert", data: valid, opts: Options{Now: now}},
		{name: "expired", data: expired, opts: Options{Now: now}, errs: []error{ErrExpired}, text: []string{`"CN=old" expired at 2029-12-31T23:00:00Z`}},
		{name: "expired is fine earlier", data: expired, opts: Options{Now: now.Add(-90 * time.Minute)}},
		{name: "not yet valid", data: future, opts: Options{Now: now}, errs: []error{ErrNotYetValid}, text: []string{"valid from 2030-01-01T01:00:00Z"}},
		{name: "params only", data: params, opts: Options{Now: now}, errs: []error{ErrNoKey}},
		{name: "public keys anywhere", data: cat(pub, pub), opts: Options{Now: now}},
		{name: "CA file refuses public key", data: cat(valid, pub), opts: Options{Now: now, Allow: Certificate},
			errs: []error{ErrKind}, text: []string{"block 2", "public key, want certificate"}},
		{name: "forbid private", data: cat(pub, priv), opts: Options{Now: now, ForbidPrivate: true},
			errs: []error{ErrPrivateKey}, text: []string{fmt.Sprintf("block 2 (line %d, RSA PRIVATE KEY)", strings.Count(string(pub), "\n")+1)}},
		{name: "allow without private names it as private", data: priv, opts: Options{Now: now, Allow: PublicKey},
			errs: []error{ErrPrivateKey}},
		{name: "require private", data: valid, opts: Options{Now: now, Require: PrivateKey},
			errs: []error{ErrMissingKind}, text: []string{"no private key"}},
		{name: "validator", data: cat(valid, pub), opts: Options{Now: now, Validate: func(b Block) error {
			if b.Kind == PublicKey {
				return errRejected
			}
			return nil
		}}, errs: []error{errRejected}, text: []string{"f.pem: block 2"}},
		{name: "every problem reported", data: cat(expired, future, priv), opts: Options{Now: now, ForbidPrivate: true},
			errs: []error{ErrExpired, ErrNotYetValid, ErrPrivateKey}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse("f.pem", tc.data)
			if err != nil {
				t.Fatal(err)
			}
			err = f.Check(tc.opts)
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tc.errs {
				if !errors.Is(err, want) {
					t.Errorf("err %q does not wrap %v", err, want)
				}
			}
			for _, s := range tc.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestMatchPair(t *testing.T) {
	now := time.Now()
	rk, other := keytest.RSA(t, 1024), keytest.EC(t)
	cert := keytest.CertPEM(t, rk, "apiserver", now.Add(-time.Hour), now.Add(time.Hour))
	keyPKCS1 := keytest.PKCS1PEM(rk)
	parse := func(name string, data []byte) *File {
		f, err := Parse(name, data)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	tests := []struct {
		name        string
		certs, keys *File
		err         error
	}{
		{name: "match", certs: parse("c.crt", cert), keys: parse("c.key", keyPKCS1)},
		{name: "match pkcs8", certs: parse("c.crt", cert), keys: parse("c.key", keytest.PKCS8PEM(t, rk))},
		{name: "combined file", certs: parse("c.pem", cat(cert, keyPKCS1)), keys: parse("c.pem", cat(cert, keyPKCS1))},
		{name: "mismatch", certs: parse("c.crt", cert), keys: parse("o.key", keytest.PKCS8PEM(t, other)), err: ErrMismatch},
		{name: "no key", certs: parse("c.crt", cert), keys: parse("c.crt", cert), err: ErrMissingKind},
		{name: "no cert", certs: parse("c.key", keyPKCS1), keys: parse("c.key", keyPKCS1), err: ErrMissingKind},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := MatchPair(tc.certs, tc.keys)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.err == ErrMismatch {
				for _, s := range []string{"c.crt", "o.key", "key ID"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("err %q does not name %q", err, s)
					}
				}
			}
		})
	}
}
