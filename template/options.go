package template

// Option changes how Render renders.
type Option func(*options)

type options struct {
	keyring *Keyring
	warn    func(string)
}

// WithKeyring makes cget, cgets, cgetv and cgetvs decrypt with k. Without
// it (or with a nil k) they fail with an error naming -secret-keyring.
func WithKeyring(k *Keyring) Option {
	return func(o *options) { o.keyring = k }
}

// WithWarnings gives warn what a render accepts but an operator should
// fix: a certificate authority's key that publicKeys leaves out.
func WithWarnings(warn func(string)) Option {
	return func(o *options) { o.warn = warn }
}
