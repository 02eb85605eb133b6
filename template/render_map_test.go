package template

import kvstore "github.com/keysync/confd/store"

// Render and Renderer.Render are RenderIndex over a map, for tests: the
// write path builds its index from the list it read (kvstore.FromPairs).

// Render keeps no parse; a Renderer does.
func Render(srcPath string, kvs map[string]string, opts ...Options) ([]byte, error) {
	return (*Renderer)(nil).Render(srcPath, kvs, opts...)
}

// Render is the package's Render with the parse kept for the next render.
func (c *Renderer) Render(srcPath string, kvs map[string]string, opts ...Options) ([]byte, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	// A fresh store per render: keys deleted upstream must not linger, and
	// concurrent renders must not see each other's keys.
	t, err := c.RenderIndex(srcPath, kvstore.New(kvs), o)
	if err != nil {
		return nil, err
	}
	defer t.Release()
	return t.Bytes(), nil
}
