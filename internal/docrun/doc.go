// Package docrun holds the docs-that-run tests: every command line of the
// three shipped binaries in README.md, docs/*.md and examples/** (systemd
// units, confd resources, Puppet templates, shell blocks, inline code) is
// parsed by the binary itself, built once, without running it; every
// configuration snippet is loaded by the binary that reads it. A test that
// finds nothing fails, so a change of the docs' layout cannot make it pass
// by checking less.
package docrun
