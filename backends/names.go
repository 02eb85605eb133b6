package backends

import "slices"

// Names lists the backends connect.New accepts, in the order help text
// lists them.
func Names() []string { return []string{"etcdv3", "etcd", "env", "file"} }

// Supported reports whether connect.New accepts name.
func Supported(name string) bool { return slices.Contains(Names(), name) }

// CanWatch reports whether backend name can serve -watch; the others are
// polled with -interval.
func CanWatch(name string) bool { return name == "etcdv3" || name == "etcd" }
