// Package suggest finds what a mistyped name (a flag, a configuration key)
// was probably meant to be, for "did you mean" hints.
package suggest

import "strings"

// Closest returns the candidate nearest to name, or "" when none is near
// enough to be a likely typo. Names equal but for case, '-' and '_' match
// first ("Health_URL" → "health-url"); then the smallest edit distance
// within a third of the name's length (at least 1, at most 3), ties going
// to the earlier candidate; then a candidate that name is a prefix of
// ("--health" → "health-url") when only one is.
func Closest(name string, candidates []string) string {
	fold := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s))
	}
	if name == "" {
		return ""
	}
	for _, c := range candidates {
		if c != name && fold(c) == fold(name) {
			return c
		}
	}
	limit := min(max(len(name)/3, 1), 3)
	best, bestD := "", limit+1
	var prefixed []string
	for _, c := range candidates {
		if c == name {
			continue
		}
		if d := distance(strings.ToLower(name), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
		if strings.HasPrefix(c, name) {
			prefixed = append(prefixed, c)
		}
	}
	if best == "" && len(prefixed) == 1 {
		return prefixed[0]
	}
	return best
}

// distance is the Levenshtein distance (insertions, deletions and
// substitutions of bytes; names here are ASCII).
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
