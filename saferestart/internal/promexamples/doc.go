// Package promexamples holds the tests of examples/prometheus: promtool
// checks and unit-tests the alert rules, and every metric the rules and the
// Grafana dashboard query must be one the binaries export, as their own
// registries (confd's metrics, the signer's, the key publisher's) say.
//
// It lives under saferestart/ because the key publisher's metrics are in
// internal packages of saferestart, which Go lets only packages below
// saferestart import. It is imported by nothing; its tests read files and
// registries only (promtool is Debian's, found by internal/toolbin).
package promexamples
