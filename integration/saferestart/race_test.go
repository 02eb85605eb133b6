//go:build race

package saferestart

// Under `go test -race` the binary under test is built with the race
// detector too, so that races in the binary itself show.
func init() { buildFlags = append(buildFlags, "-race") }
