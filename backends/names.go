package backends

// names are the backends connect.New accepts, in the order help text lists them,
// and whether each can be watched (the others are polled with -interval).
var names = []struct {
	name  string
	watch bool
}{{"etcdv3", true}, {"etcd", true}, {"env", false}, {"file", false}}

// Names lists the backends connect.New accepts.
func Names() []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n.name
	}
	return out
}

// Supported reports whether connect.New accepts name.
func Supported(name string) bool { _, ok := lookup(name); return ok }

// CanWatch reports whether backend name can serve -watch.
func CanWatch(name string) bool { n, ok := lookup(name); return ok && n.watch }

func lookup(name string) (struct {
	name  string
	watch bool
}, bool) {
	for _, n := range names {
		if n.name == name {
			return n, true
		}
	}
	return names[0], false
}
