// Package version holds the release version of the module's three
// binaries, the commit they were built from and that commit's date. The
// Makefile stamps them with -ldflags "-X
// github.com/keysync/confd/internal/version.Version=..." (and Commit,
// Date; scripts/version.sh computes them), so confd,
// kube-apiserver-safe-restart and kube-apiserver-sa-signer built together
// report the same version. Date is the commit's, or SOURCE_DATE_EPOCH's,
// never the build's: the same commit builds the same bytes.
package version

import (
	"cmp"
	"runtime/debug"
	"strings"
	"time"
)

// Version is the release version: the tag without its v, or
// 0.0.0~git<YYYYMMDDhhmmss>.<hash> before any tag; built without the
// Makefile, the module's version without its v (`go install ...@v1.2.3`),
// else "dev".
var Version = "dev"

// Commit is the full commit hash and Date its date, RFC 3339 in UTC. Built
// without the Makefile, they are what `go build` recorded of the checkout
// (vcs.revision, vcs.time), or "unknown" (go test, a source tarball).
var Commit, Date string

func init() {
	// -X can only set a string to a constant, so the fallback is filled
	// in here, and only where the Makefile set nothing.
	rev, at, modified := "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		Version = moduleVersion(Version, bi.Main)
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if Commit == "" {
		Commit = cmp.Or(rev, "unknown")
		if rev != "" && modified {
			Commit += "+dirty"
		}
	}
	if Date == "" {
		Date = "unknown"
		if t, err := time.Parse(time.RFC3339, at); err == nil {
			Date = t.UTC().Format(time.RFC3339)
		}
	}
}

// Details is what --version prints after its first line: the commit and
// its date, one per line.
func Details() string {
	return "commit: " + Commit + "\ndate: " + Date + "\n"
}

// Text is what a helper's --version and version print: name and version on
// the first line (what a script reads), then Details.
func Text(name string) string {
	return name + " " + Version + "\n" + Details()
}

// moduleVersion is the version a binary built without the Makefile
// reports: v, unless v is the default and Go recorded the module's version
// (`go install MODULE/cmd/confd@v1.2.3` builds from the module cache, with
// no VCS information, so that is all there is to say which release it is).
func moduleVersion(v string, main debug.Module) string {
	if v != "dev" || main.Version == "" || main.Version == "(devel)" {
		return v
	}
	return strings.TrimPrefix(main.Version, "v")
}
