package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// row is one line of the table: one scenario on one binary.
type row struct {
	scenario string
	binary   string
	samples  []time.Duration
	target   string  // the limit, in words
	ratio    float64 // median (or the measured figure) over the limit; 0: none
	rss      int64   // peak RSS in bytes; 0: not measured
	note     string
}

type report struct {
	cfg     config
	started time.Time
	machine machine
	rows    []row
}

func (r *report) add(x row) { r.rows = append(r.rows, x) }

func median(s []time.Duration) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[len(c)/2]
}

// quantile is the nearest-rank q-quantile.
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(q*float64(len(c)) + 0.5)
	return c[min(max(i-1, 0), len(c)-1)]
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}

func (x row) cells() []string {
	med, spread := "-", "-"
	if len(x.samples) > 0 {
		med = fmtDur(median(x.samples))
		spread = fmtDur(slices.Min(x.samples)) + "–" + fmtDur(slices.Max(x.samples))
	}
	ratio := "-"
	if x.ratio > 0 {
		verdict := "ok"
		if x.ratio > 1 {
			verdict = "MISS"
		}
		ratio = fmt.Sprintf("%.2f %s", x.ratio, verdict)
	}
	rss := "-"
	if x.rss > 0 {
		rss = fmt.Sprintf("%.1f MB", float64(x.rss)/1e6)
	}
	return []string{x.scenario, x.binary, fmt.Sprint(len(x.samples)), med, spread, x.target, ratio, rss, x.note}
}

var header = []string{"scenario", "binary", "n", "median", "spread", "target", "ratio", "peak RSS", "notes"}

// table is the plain-text table printed at the end of a run.
func (r *report) table() string {
	all := [][]string{header}
	for _, x := range r.rows {
		all = append(all, x.cells())
	}
	width := make([]int, len(header))
	for _, cells := range all {
		for i, c := range cells {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, cells := range all {
		for i, c := range cells {
			b.WriteString(c)
			if i < len(cells)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-len([]rune(c))+2))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	mode := fmt.Sprintf("%d runs", r.cfg.Runs)
	if r.cfg.Smoke {
		mode = "SMOKE (tiny data, one run: proves the harness works, measures nothing)"
	}
	fmt.Fprintf(&b, "# Benchmark results\n\nWritten by `make bench` (`go run ./bench`) on %s; %s.\n\n",
		r.started.UTC().Format(time.RFC3339), mode)
	m := r.machine
	fmt.Fprintf(&b, "## Machine\n\n- %s\n- CPU: %s, %d cores\n- memory: %s\n- load average at start: %s; at end: %s\n- %s; %s\n- confd: `%s` (%s)\n",
		m.kernel, m.cpu, runtime.NumCPU(), m.mem, m.loadStart, m.loadEnd, runtime.Version(), m.etcd, r.cfg.Confd, version(r.cfg.Confd))
	if r.cfg.Ref != "" {
		fmt.Fprintf(&b, "- reference (CONFD_REF): `%s` (%s)\n", r.cfg.Ref, version(r.cfg.Ref))
	}
	if r.cfg.Fork != "" {
		fmt.Fprintf(&b, "- the maintained fork (CONFD_FORK): `%s` (%s)\n", r.cfg.Fork, version(r.cfg.Fork))
	}
	fmt.Fprintf(&b, "\nData: %d keys flat; %d directories × %d keys (and a tenth and ten times that, for linearity); "+
		"%d watch samples; %d puts back to back; %d resources idle.\n\n",
		r.cfg.FlatKeys, r.cfg.Dirs, r.cfg.DirKeys, r.cfg.WatchSamples, r.cfg.BackToBack, r.cfg.Resources)
	b.WriteString("Ratio is the measured figure over its limit: ≤ 1 meets the target.\n\n")
	b.WriteString("| " + strings.Join(header, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(header)) + "\n")
	for _, x := range r.rows {
		b.WriteString("| " + strings.Join(x.cells(), " | ") + " |\n")
	}
	return b.String()
}

type machine struct {
	kernel, cpu, mem, etcd string
	loadStart, loadEnd     string
}

func machineInfo(etcdBin string) machine {
	m := machine{kernel: "?", cpu: "?", mem: "?", etcd: "etcd ?", loadStart: loadAvg()}
	if out, err := exec.Command("uname", "-srmo").Output(); err == nil {
		m.kernel = strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.mem = strings.TrimSpace(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"))
	}
	if out, err := exec.Command(etcdBin, "--version").Output(); err == nil {
		m.etcd = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}
	return m
}

// version is what a confd binary says of itself.
func version(bin string) string {
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		return "version unknown"
	}
	return strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Markers of the results block in bench/results.md, which make bench
// replaces, so that the notes kept around it survive every run.
const (
	resultsBegin = "<!-- bench results: regenerated by `make bench` -->"
	resultsEnd   = "<!-- end of bench results -->"
)

// writeResults puts a run's table into the results file at path: into its
// results block when it has one, else as the whole file (a new file, or
// the smoke test's).
func writeResults(path, md string) error {
	doc, err := os.ReadFile(path)
	if err == nil && strings.Contains(string(doc), resultsBegin) {
		return spliceResults(path, md)
	}
	return os.WriteFile(path, []byte(md), 0o644)
}

// spliceResults replaces the results block of the markdown file at path
// with md, its headings one level down (the file has its own title).
func spliceResults(path, md string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(doc)
	i, j := strings.Index(s, resultsBegin), strings.Index(s, resultsEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no results block (%q … %q)", path, resultsBegin, resultsEnd)
	}
	var body strings.Builder
	for _, line := range strings.SplitAfter(md, "\n") {
		switch {
		case strings.HasPrefix(line, "# "):
			continue // the file's own heading stands above the block
		case strings.HasPrefix(line, "#"):
			line = "#" + line
		}
		body.WriteString(line)
	}
	out := s[:i+len(resultsBegin)] + "\n" + strings.TrimSpace(body.String()) + "\n" + s[j:]
	return os.WriteFile(path, []byte(out), 0o644)
}
