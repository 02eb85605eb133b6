// Package textfile writes the node_exporter textfile of restart and
// rotate-key (--metrics-textfile): when each command last ended and its
// exit code, one file shared by the commands.
package textfile

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keysync/confd/internal/atomicfile"
)

// The metrics the file holds, each with a command label.
const (
	TimestampMetric = "kube_apiserver_safe_restart_last_run_timestamp_seconds"
	ExitCodeMetric  = "kube_apiserver_safe_restart_last_run_exit_code"
)

// Write records that command ended at end with code in path, atomically
// (node_exporter never reads half a file), keeping the samples of the
// other commands the file holds.
func Write(path, command string, code int, end time.Time) error {
	samples := map[string]map[string]string{TimestampMetric: {}, ExitCodeMetric: {}}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read --metrics-textfile %s: %w", path, err)
	}
	for _, line := range strings.Split(string(old), "\n") {
		name, rest, ok := strings.Cut(line, `{command="`)
		if !ok || samples[name] == nil {
			continue
		}
		cmd, value, ok := strings.Cut(rest, `"} `)
		if ok && cmd != command {
			samples[name][cmd] = value
		}
	}
	samples[TimestampMetric][command] = strconv.FormatFloat(float64(end.UnixMilli())/1e3, 'f', -1, 64)
	samples[ExitCodeMetric][command] = strconv.Itoa(code)
	var b strings.Builder
	for _, m := range []struct{ name, help string }{
		{TimestampMetric, "When the command last ended (Unix seconds)."},
		{ExitCodeMetric, "The exit code the command last ended with (0 ok; see kube-apiserver-safe-restart --help)."},
	} {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", m.name, m.help, m.name)
		for _, c := range slices.Sorted(maps.Keys(samples[m.name])) {
			fmt.Fprintf(&b, "%s{command=%q} %s\n", m.name, c, samples[m.name][c])
		}
	}
	if err := atomicfile.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("--metrics-textfile: %w (its directory must exist and be writable: node_exporter's --collector.textfile.directory)", err)
	}
	return nil
}
