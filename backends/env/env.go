// Package env serves keys from environment variables, as confd's env
// backend does: key "/foo/bar" is looked up as FOO_BAR, and a variable
// FOO_BAR_BAZ comes back as key "/foo/bar/baz".
package env

import (
	"context"
	"os"
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

// GetValues returns every variable whose name is the transformed key or
// lies below it (FOO_BAR for /foo/bar matches FOO_BAR and FOO_BAR_X, not
// FOO_BARX), under its cleaned name. The revision is always 0.
func (c *Client) GetValues(ctx context.Context, keys []string) (map[string]string, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = transform(k)
	}
	vars := make(map[string]string)
	for _, kv := range c.environ() {
		name, value, ok := strings.Cut(kv, "=")
		// Entries without "=" or with an empty name (Windows' "=C:=C:\")
		// are not variables a key can name.
		if !ok || name == "" {
			continue
		}
		for _, want := range names {
			if nameUnder(name, want) {
				vars[clean(name)] = value
				break
			}
		}
	}
	return vars, 0, nil
}

// Close has nothing to release.
func (c *Client) Close() error { return nil }

// transform maps a key to the variable name confd looks for.
func transform(key string) string {
	return strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(key, "/"), "/", "_"))
}

// clean maps a variable name back to a key.
func clean(name string) string {
	return "/" + strings.ReplaceAll(strings.ToLower(name), "_", "/")
}

// nameUnder is the path rule of the other backends expressed on variable
// names, where "_" stands for "/". confd used a bare string prefix here, so
// key /foo/bar also returned FOO_BARBAZ as /foo/barbaz.
func nameUnder(name, want string) bool {
	if want == "" || strings.HasSuffix(want, "_") {
		return strings.HasPrefix(name, want)
	}
	return name == want || (strings.HasPrefix(name, want) && name[len(want)] == '_')
}
