// Package waitspec reads quiescence settings, "MIN[:MAX]" in Go durations,
// as the -wait flag, confd.toml's wait and a resource's wait spell them
// (consul-template's wait): render once MIN has passed without a new event,
// and never later than MAX after the first one.
package waitspec

import (
	"fmt"
	"strings"
	"time"
)

// Spec is a quiescence window; the zero Spec renders at once.
type Spec struct {
	Min, Max time.Duration
}

// Parse reads "MIN" or "MIN:MAX". Without MAX, MAX is 4×MIN, as
// consul-template chose. "0" (or "") turns quiescence off.
func Parse(s string) (Spec, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return Spec{}, nil
	}
	minS, maxS, hasMax := strings.Cut(s, ":")
	min, err := time.ParseDuration(minS)
	if err != nil {
		return Spec{}, fmt.Errorf("wait %q: MIN: %w (want MIN[:MAX] in Go durations, e.g. 2s:10s)", s, err)
	}
	max := 4 * min
	if hasMax {
		if max, err = time.ParseDuration(maxS); err != nil {
			return Spec{}, fmt.Errorf("wait %q: MAX: %w (want MIN[:MAX] in Go durations, e.g. 2s:10s)", s, err)
		}
	}
	switch {
	case min < 0 || max < 0:
		return Spec{}, fmt.Errorf("wait %q: durations must not be negative", s)
	case max < min:
		return Spec{}, fmt.Errorf("wait %q: MAX %s is shorter than MIN %s", s, max, min)
	}
	return Spec{Min: min, Max: max}, nil
}

// String is the form Parse reads.
func (s Spec) String() string {
	if s.Min == 0 && s.Max == 0 {
		return "0"
	}
	return s.Min.String() + ":" + s.Max.String()
}

// Set and Type make *Spec a pflag.Value, so -wait is parsed once, here.
func (s *Spec) Set(v string) error {
	p, err := Parse(v)
	if err != nil {
		return err
	}
	*s = p
	return nil
}

func (s *Spec) Type() string { return "MIN[:MAX]" }
