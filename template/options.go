package template

// Option changes how Render renders.
type Option func(*options)

type options struct {
	keyring *Keyring
}

// WithKeyring makes cget, cgets, cgetv and cgetvs decrypt with k. Without
// it (or with a nil k) they fail with an error naming -secret-keyring.
func WithKeyring(k *Keyring) Option {
	return func(o *options) { o.keyring = k }
}
