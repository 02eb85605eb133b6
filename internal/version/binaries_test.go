package version_test

import (
	"os/exec"
	"testing"

	"github.com/keysync/confd/internal/testbin"
)

// Each binary's --version (and the helpers' version subcommand) prints
// what -ldflags -X stamped, as `make build` stamps it: the version on the
// first line, then the commit and its date.
func TestBinariesPrintStamp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the three binaries")
	}
	const (
		v      = "0.0.0~git20240102030405.0123456789ab+dirty"
		commit = "0123456789abcdef0123456789abcdef01234567"
		date   = "2024-01-02T03:04:05Z"
	)
	pkg := "github.com/keysync/confd/internal/version"
	ldflags := "-X " + pkg + ".Version=" + v + " -X " + pkg + ".Commit=" + commit + " -X " + pkg + ".Date=" + date
	bins, cleanup, err := testbin.Build([]string{"-ldflags", ldflags}, map[string]string{
		"confd":                       "./cmd/confd",
		"kube-apiserver-safe-restart": "./cmd/kube-apiserver-safe-restart",
		"kube-apiserver-sa-signer":    "./cmd/kube-apiserver-sa-signer",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	tail := "\ncommit: " + commit + "\ndate: " + date + "\n"
	for _, tc := range []struct {
		bin   string
		args  []string
		first string
	}{
		{"confd", []string{"--version"}, "confd " + v + " (compatible with confd 0.16)"},
		{"confd", []string{"-version"}, "confd " + v + " (compatible with confd 0.16)"},
		{"kube-apiserver-safe-restart", []string{"--version"}, "kube-apiserver-safe-restart " + v},
		{"kube-apiserver-safe-restart", []string{"--config", "", "version"}, "kube-apiserver-safe-restart " + v},
		{"kube-apiserver-sa-signer", []string{"--version"}, "kube-apiserver-sa-signer " + v},
		{"kube-apiserver-sa-signer", []string{"--config", "", "version"}, "kube-apiserver-sa-signer " + v},
	} {
		out, err := exec.Command(bins[tc.bin], tc.args...).Output()
		if err != nil || string(out) != tc.first+tail {
			t.Errorf("%s %q: %v\n%s", tc.bin, tc.args, err, out)
		}
	}
}
