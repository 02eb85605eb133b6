package promexamples

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// PromQL words that are not metric names: binary operators and modifiers,
// aggregation operators (written before `(` or `by`/`without`), and the
// number literals.
var (
	promqlKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
		"inf": true, "nan": true,
	}
	promqlAggregations = map[string]bool{
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
		"limitk": true, "limit_ratio": true,
	}
	// promqlGrouping are the modifiers followed by a list of label names.
	promqlGrouping = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	}
)

// metricNames returns the metric names an expression selects, in order, each
// once. It is a tokenizer, not a parser (Prometheus' parser is no module
// dependency of ours): strings, label matchers `{…}`, ranges `[…]`, the
// label lists of by/without/on/ignoring/group_left/group_right, numbers and
// durations, comments and Grafana variables ($x, ${x}) are skipped; an
// identifier followed by `(` is a function, and keywords and aggregation
// operators are not names; every other identifier is. A matcher without a
// metric name before it ({__name__="…"}) is an error: the check could not
// see which metric it selects.
func metricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	i := 0
	afterName := false // the previous token was a metric name
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
			continue
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			if !afterName {
				return nil, fmt.Errorf("%q: a selector without a metric name at offset %d: name the metric before {", expr, i)
			}
			j, err := skipBalanced(s, i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = j
			afterName = false
			continue
		case c == '[':
			j, err := skipBalanced(s, i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				j, err := skipBalanced(s, i, '{', '}')
				if err != nil {
					return nil, err
				}
				i = j
			} else {
				for i < len(s) && isIdent(s[i], false) {
					i++
				}
			}
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			for i < len(s) && (isIdent(s[i], false) || s[i] == '.') {
				i++
			}
		case isIdent(c, true):
			j := i
			for j < len(s) && isIdent(s[j], false) {
				j++
			}
			word := s[i:j]
			lower := strings.ToLower(word)
			next := j
			for next < len(s) && strings.IndexByte(" \t\r\n", s[next]) >= 0 {
				next++
			}
			i = j
			switch {
			case promqlGrouping[lower]:
				if next < len(s) && s[next] == '(' {
					k, err := skipBalanced(s, next, '(', ')')
					if err != nil {
						return nil, err
					}
					i = k
				}
			case promqlKeywords[lower], promqlAggregations[lower]:
			case next < len(s) && s[next] == '(':
				// a function call: its arguments are read on
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
				afterName = true
				continue
			}
		default:
			i++
		}
		afterName = false
	}
	return names, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isIdent reports whether c may start (first) or continue a metric name.
func isIdent(c byte, first bool) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && isDigit(c))
}

// skipString returns the offset after the string literal starting at i.
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("%q: unterminated string at offset %d", s, i)
}

// skipBalanced returns the offset after the close that matches the open at
// i, strings inside included.
func skipBalanced(s string, i int, open, close byte) (int, error) {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '"', '\'', '`':
			k, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = k - 1
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("%q: no %c for the %c at offset %d", s, close, open, i)
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`confd_watch_up == 0`, []string{"confd_watch_up"}},
		{`max without(instance) (kube_apiserver_safe_restart_untrusted_keys) > 0`, []string{"kube_apiserver_safe_restart_untrusted_keys"}},
		{`sum by (instance, result) (rate(confd_resource_reload_total{result="failed", resource=~"a{1}"}[$__rate_interval]))`, []string{"confd_resource_reload_total"}},
		{`label_replace(a == 0, "reason", "etcd", "", "") or label_replace(rate(b[10m]) == 0, "reason", "x(y)", "", "")`, []string{"a", "b"}},
		{"min without(instance) (x)\n  * ignoring(phase) group_right()\n(max without(instance) (y{phase=~\"a|b\"}) > 0) > 3600", []string{"x", "y"}},
		{`time() - x offset 5m > 1.5e3 and on(job) y @ start() unless z[1h:1m]`, []string{"x", "y", "z"}},
		{`-min without(instance) (due) > 7200 # seconds past due`, []string{"due"}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket[${interval}])))`, []string{"h_bucket"}},
		{`count_values("v", a) AND BOOL b OR c BY (x)`, []string{"a", "b", "c"}},
		{`absent(up) or vector(1) or NaN or Inf`, []string{"up"}},
		{`x + x{a="1"} / x`, []string{"x"}},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("metricNames(%q): %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`{__name__="x"}`, `rate(x[5m)`, `x{a="b}`, `sum by (a (x)`} {
		if got, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q) = %q, want an error", bad, got)
		}
	}
}
