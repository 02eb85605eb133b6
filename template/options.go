package template

// Options are what a render is given beside its template and keys.
type Options struct {
	// Keyring makes cget, cgets, cgetv and cgetvs decrypt with it. Without
	// it they fail with an error naming -secret-keyring.
	Keyring *Keyring
	// Warn is given what a render accepts but an operator should fix: a
	// certificate authority's key that publicKeys leaves out. May be nil.
	Warn func(string)
}
