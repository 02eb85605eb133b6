// Package suggest finds what a mistyped name (a flag, a configuration key)
// probably meant, for "did you mean" hints.
package suggest

import "strings"

// Closest returns the candidate that name most likely meant: one that
// differs only in case, dashes and underscores ("checkcmd", "check-cmd",
// "CheckCmd" → "check_cmd"), else the single nearest one within two edits
// (a typo: "-onetim" → "onetime"). Empty when nothing is close, or when
// two candidates are equally close.
func Closest(name string, candidates []string) string {
	f := fold(name)
	if f == "" {
		return ""
	}
	for _, c := range candidates {
		if fold(c) == f {
			return c
		}
	}
	best, bestD, tie := "", 3, false
	for _, c := range candidates {
		d := distance(f, fold(c))
		switch {
		case d < bestD:
			best, bestD, tie = c, d, false
		case d == bestD:
			tie = true
		}
	}
	// A short name is too easily near anything.
	if best == "" || tie || len(f) <= bestD+1 {
		return ""
	}
	return best
}

func fold(s string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s))
}

// distance is the Levenshtein distance of a and b (bytes).
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
