package integration

import (
	"debug/elf"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// The binaries are static, as confd 0.16's releases were: no program
// interpreter and no shared library, so one build runs on every master
// whatever its libc.
func TestBinariesAreStatic(t *testing.T) {
	for _, bin := range []string{confdBin, restartBin} {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s needs a program interpreter", filepath.Base(bin))
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("%s links %q (%v)", filepath.Base(bin), libs, err)
		}
		_ = f.Close()
	}
}

// Built static, confd looks owner and group names up in /etc/passwd and
// /etc/group itself: nobody's names (another user than the test's, so a
// name that was ignored would show) resolve to nobody's ids.
func TestStaticBinaryResolvesOwnerNames(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another user needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		t.Skipf("nobody's group %s has no name: %v", u.Gid, err)
	}
	s := etcdtest.Start(t)
	s.Put(t, "/owned/a", "1")
	c := newConfdir(t)
	dest := c.resource("owned",
		"[template]\nsrc = \"owned.tmpl\"\ndest = \"DEST\"\nkeys = [\"/owned\"]\nowner = "+strconv.Quote(u.Username)+"\ngroup = "+strconv.Quote(g.Name)+"\n",
		"{{getv \"/owned/a\"}}\n")
	if r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)...); r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	fi, err := os.Stat(dest)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if strconv.Itoa(int(st.Uid)) != u.Uid || strconv.Itoa(int(st.Gid)) != g.Gid {
		t.Fatalf("%s owned by %d:%d, want %s:%s (%s:%s)", dest, st.Uid, st.Gid, u.Uid, g.Gid, u.Username, g.Name)
	}
	// A name that is nowhere is an error naming the resource's key.
	c.resource("owned", "[template]\nsrc = \"owned.tmpl\"\ndest = \"DEST\"\nkeys = [\"/owned\"]\nowner = \"no-such-user-in-passwd\"\n", "")
	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)...)
	if r.code == 0 || !strings.Contains(r.stderr, "template.owner") {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
}
