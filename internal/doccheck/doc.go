// Package doccheck holds tests that keep the docs true to the code: the
// package table of docs/architecture.md against the module's packages, and
// the tree's shape (mains under cmd/, no type of the binaries' packages
// with more than 15 methods, no such package over 2,000 lines).
// They read files only (no etcd, no built binary), so they run in
// `make unit` as well as in `make test`.
package doccheck
