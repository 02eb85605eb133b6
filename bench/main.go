// Command bench measures confd and kube-apiserver-safe-restart against the
// performance targets of issue 10, on its own etcd on loopback, beside what
// etcdctl and etcd itself take for the same work in the same run (and,
// with CONFD_REF=path, beside another confd binary run with the same
// flags on the same data). It prints one table and writes it, with the
// machine it ran on, into the results block of bench/results.md.
//
//	go run ./bench [-runs 5] [-smoke] [-only flat,values,dirs,watch,idle,burst,restart,tenfold]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// config is one harness run: which binaries, how big, how often.
type config struct {
	Confd       string // confd under test
	Ref         string // another confd to run beside it; empty: none
	Fork        string // abtreece/confd, the maintained fork (subcommand CLI); empty: none
	SafeRestart string
	EtcdDir     string // holds etcd and etcdctl
	Runs        int
	Smoke       bool
	Only        map[string]bool // scenarios to run; empty: all
	Out         string          // results file; empty: none
	WorkDir     string
	Root        string // module root, where bench/launcher is built from

	FlatKeys      int // target 1
	Dirs, DirKeys int // target 2
	WatchSamples  int // target 3
	BackToBack    int // target 3 and 5
	Resources     int // target 4
	IdleFor       time.Duration
	Log           io.Writer
}

func (c *config) sized() {
	if c.Smoke {
		c.Runs = 1
		c.FlatKeys, c.Dirs, c.DirKeys = 2000, 20, 100
		c.WatchSamples, c.BackToBack, c.Resources = 5, 10, 20
		c.IdleFor = 300 * time.Millisecond
		return
	}
	c.FlatKeys, c.Dirs, c.DirKeys = 100_000, 1000, 100
	c.WatchSamples, c.BackToBack, c.Resources = 100, 100, 1000
	// Longer than the default -watch-stall-timeout (30 s): a quiet watch
	// taken for stalled would reconnect within the window, and show.
	c.IdleFor = 35 * time.Second
}

func main() {
	var c config
	var only string
	root := repoRoot()
	etcdDir := os.Getenv("ETCD_BIN_DIR")
	if etcdDir == "" {
		etcdDir = filepath.Join(root, ".tools", "etcd-3.6.16")
	}
	flag.StringVar(&c.Confd, "confd", filepath.Join(root, "bin", "confd"), "confd binary under test")
	flag.StringVar(&c.Ref, "ref", os.Getenv("CONFD_REF"), "another confd binary to run beside it, same flags and data [env CONFD_REF]")
	flag.StringVar(&c.Fork, "fork", os.Getenv("CONFD_FORK"), "abtreece/confd (the maintained fork, `confd etcd --node ...` CLI) to run beside it in target 1 [env CONFD_FORK]")
	flag.StringVar(&c.SafeRestart, "safe-restart", filepath.Join(root, "bin", "kube-apiserver-safe-restart"), "kube-apiserver-safe-restart binary")
	flag.StringVar(&c.EtcdDir, "etcd-bin-dir", etcdDir, "directory holding etcd and etcdctl [env ETCD_BIN_DIR]")
	flag.IntVar(&c.Runs, "runs", 5, "runs of each one-shot scenario (and rounds of the daemon ones)")
	flag.BoolVar(&c.Smoke, "smoke", false, "tiny data, one run: proves the harness works (CI), measures nothing")
	flag.StringVar(&only, "only", "", "comma-separated scenarios: flat,values,dirs,watch,idle,burst,restart,tenfold")
	flag.StringVar(&c.Out, "out", filepath.Join(root, "bench", "results.md"), "results file: the table replaces its results block, or the whole file when it has none (empty: none)")
	flag.Parse()
	c.Only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		if s != "" {
			c.Only[s] = true
		}
	}
	c.Log = os.Stderr
	c.Root = root
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "confd-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	c.WorkDir = dir
	rep, err := runBench(ctx, c)
	_ = os.RemoveAll(dir)
	if rep != nil {
		fmt.Print(rep.table())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// repoRoot is the module root when run from it (make bench, go run ./bench).
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return wd
		}
	}
}

// runBench starts etcd, loads the data sets and runs every scenario. A
// scenario that fails is reported in its row; the others still run.
func runBench(ctx context.Context, c config) (*report, error) {
	c.sized()
	for _, p := range []string{c.Confd, c.SafeRestart, filepath.Join(c.EtcdDir, "etcd"), filepath.Join(c.EtcdDir, "etcdctl")} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%w (run `make build etcd` first)", err)
		}
	}
	rep := &report{cfg: c, started: time.Now(), machine: machineInfo(filepath.Join(c.EtcdDir, "etcd"))}
	srv, err := startEtcd(ctx, filepath.Join(c.EtcdDir, "etcd"), filepath.Join(c.WorkDir, "etcd", "data"))
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	l, err := startLauncher(c.Root, c.WorkDir)
	if err != nil {
		return nil, err
	}
	defer l.close()
	b := &bench{cfg: c, etcd: srv, rep: rep, l: l, etcdctl: filepath.Join(c.EtcdDir, "etcdctl")}
	scenarios := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"flat", b.flat},
		{"values", b.values},
		{"dirs", b.dirs},
		{"watch", b.watch},
		{"idle", b.idle},
		{"burst", b.burst},
		{"restart", b.restart},
		{"tenfold", b.tenfold},
	}
	var failed []string
	for _, s := range scenarios {
		if len(c.Only) > 0 && !c.Only[s.name] {
			continue
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		fmt.Fprintf(c.Log, "bench: %s...\n", s.name)
		if err := s.fn(ctx); err != nil {
			failed = append(failed, s.name)
			rep.add(row{scenario: s.name, binary: "-", note: "FAILED: " + firstLine(err.Error())})
			fmt.Fprintf(c.Log, "bench: %s: %v\n", s.name, err)
		}
	}
	rep.machine.loadEnd = loadAvg()
	if c.Out != "" {
		if err := writeResults(c.Out, rep.markdown()); err != nil {
			return rep, err
		}
	}
	if len(failed) > 0 {
		return rep, fmt.Errorf("scenarios failed: %s", strings.Join(failed, ", "))
	}
	return rep, nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
