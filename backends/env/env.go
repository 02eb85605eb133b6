// Package env serves keys from environment variables, as confd's env
// backend does: key "/foo/bar" is looked up as FOO_BAR, and a variable
// FOO_BAR_BAZ comes back as key "/foo/bar/baz".
package env

import (
	"context"
	"os"
	"slices"
	"strings"
)

// Client reads the process environment (or an injected one) on every call,
// so a preview sees the environment as it is when the template is rendered.
type Client struct {
	environ func() []string
}

// New returns a client reading environ, or os.Environ when environ is nil.
func New(environ func() []string) *Client {
	if environ == nil {
		environ = os.Environ
	}
	return &Client{environ: environ}
}

// GetValues returns every variable whose name is a key's, upper-cased with
// "_" for "/", or lies below it (FOO_BAR for /foo/bar matches FOO_BAR and
// FOO_BAR_X, not FOO_BARX), under its name lower-cased with "/" for "_".
// The revision is always 0.
func (c *Client) GetValues(ctx context.Context, keys []string) (map[string]string, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(k, "/"), "/", "_"))
	}
	vars := make(map[string]string)
	for _, kv := range c.environ() {
		name, value, ok := strings.Cut(kv, "=")
		// Entries without "=" or with an empty name (Windows' "=C:=C:\")
		// are not variables a key can name.
		if !ok || name == "" {
			continue
		}
		if slices.ContainsFunc(names, func(want string) bool { return nameUnder(name, want) }) {
			vars["/"+strings.ReplaceAll(strings.ToLower(name), "_", "/")] = value
		}
	}
	return vars, 0, nil
}

// Close has nothing to release.
func (c *Client) Close() error { return nil }

// nameUnder is the path rule of the other backends expressed on variable
// names, where "_" stands for "/". confd used a bare string prefix here, so
// key /foo/bar also returned FOO_BARBAZ as /foo/barbaz.
func nameUnder(name, want string) bool {
	if want == "" || strings.HasSuffix(want, "_") {
		return strings.HasPrefix(name, want)
	}
	return name == want || (strings.HasPrefix(name, want) && name[len(want)] == '_')
}
