package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// gate is a FIFO that reload commands block on ("read x < gate") until the
// test lets one through by writing a line. The test holds it open for
// writing, so a line written before a command opens it waits for it, and
// nothing written is lost.
type gate struct {
	path string
	f    *os.File
}

func newGate(t *testing.T) *gate {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	// O_RDWR never blocks on a FIFO, and keeps it open for readers.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &gate{path: p, f: f}
}

// open lets n blocked (or future) commands through.
func (g *gate) open(t *testing.T, n int) {
	t.Helper()
	if _, err := g.f.WriteString(strings.Repeat("go\n", n)); err != nil {
		t.Fatal(err)
	}
}

// heldResource is a resource on key whose reload_cmd reports
// "NAME=VALUE" on ev as it starts and then waits at g.
func (c *confdir) heldResource(ev *events, g *gate, name, key string) string {
	c.t.Helper()
	return c.resource(name,
		fmt.Sprintf("[template]\nsrc = %q\ndest = \"DEST\"\nkeys = [%q]\nreload_cmd = \"echo %s=$(cat {{.dest}}) > %s; read x < %s\"\n",
			name+".tmpl", key, name, ev.path, g.path),
		fmt.Sprintf("{{getv %q}}\n", key+"/v"))
}

// TestSlowReloadDelaysNoOtherGroup: while a's reload_cmd runs (blocked
// until the test lets it end), a change of b's key reaches b's file and
// b's reload; changes of a's key made meanwhile are one pass after it, at
// the newest value. An ordering, not a timing: b's change lands before a
// is released.
func TestSlowReloadDelaysNoOtherGroup(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/ga/v", "a0")
	s.Put(t, "/gb/v", "b0")
	c, ev, g := newConfdir(t), newEvents(t), newGate(t)
	c.heldResource(ev, g, "a", "/ga")
	bFile := c.namedReporting(ev, "b", "/gb", "")
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
	t.Cleanup(func() { g.open(t, 100) }) // runs before confd is stopped
	expectGroupEvents(t, ev, p.out, []string{"a=a0"}, []string{"b=b0"})
	// a's reload now waits at the gate.
	for i := 1; i <= 20; i++ {
		s.Put(t, "/ga/v", fmt.Sprintf("a%d", i))
	}
	s.Put(t, "/gb/v", "b1")
	expectEvents(t, ev, p.out, "b=b1")
	if got := readFile(t, bFile); got != "b1\n" {
		t.Fatalf("b's file %q, want b1", got)
	}
	// Only now may a's reload end; the twenty changes are one pass.
	g.open(t, 1)
	expectEvents(t, ev, p.out, "a=a20")
	g.open(t, 1)
}

// TestMaxCommandsBoundsCommands: five resources that all reload at
// start-up, with -max-commands 2: two commands run, three say that they
// wait, and however the test lets them end, never more than two overlap.
func TestMaxCommandsBoundsCommands(t *testing.T) {
	const n, limit = 5, 2
	s := etcdtest.Start(t)
	c, ev, g := newConfdir(t), newEvents(t), newGate(t)
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("/mc%d", i)
		s.Put(t, key+"/v", "v")
		c.resource(fmt.Sprintf("m%d", i),
			fmt.Sprintf("[template]\nsrc = \"m%d.tmpl\"\ndest = \"DEST\"\nkeys = [%q]\nreload_cmd = \"echo start > %s; read x < %s; echo end > %[3]s\"\n", i, key, ev.path, g.path),
			fmt.Sprintf("{{getv %q}}\n", key+"/v"))
	}
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir, "--max-commands", fmt.Sprint(limit))...)
	t.Cleanup(func() { g.open(t, 100) })
	running, most, started, ended, released := 0, 0, 0, 0, 0
	for ended < n {
		switch l := ev.next(t, 30*time.Second, p.out); l {
		case "start":
			running++
			started++
			most = max(most, running)
			if running > limit {
				t.Fatalf("%d commands run at once, -max-commands %d", running, limit)
			}
			if started == limit {
				// Every other reload is due now and must say it waits.
				p.waitLog(t, "A command waits for its turn", n-limit, 30*time.Second)
			}
		case "end":
			running--
			ended++
		default:
			t.Fatalf("event %q", l)
		}
		// Let one end when the limit is reached or no more will start.
		if running > 0 && released == ended && (running == limit || started == n) {
			g.open(t, 1)
			released++
		}
	}
	if most != limit {
		t.Errorf("at most %d commands ran at once, want %d", most, limit)
	}
}
