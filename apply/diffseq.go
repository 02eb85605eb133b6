package apply

// This file computes which lines differ the way GNU diff does, so that
// -noop prints the hunks diff -u would print for the same two files: the
// same minimal edit (Myers' middle-snake divide and conquer), the same
// treatment of lines that have no match or too many, and the same sliding
// of each run of changes to its final place. Written from the description
// of GNU diff's analyze.c and diffseq.h; no code is shared.

// diffLines marks the lines of a and b that are not part of the common
// subsequence diff -u would choose.
func diffLines(a, b []string) (ca, cb []bool) {
	ids := map[string]int{}
	equivs := func(lines []string) []int {
		out := make([]int, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = len(ids) + 1
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	ea, eb := equivs(a), equivs(b)
	// One slot of padding at each end, always false, as the loops below
	// read one past a run of changes.
	pa, pb := make([]bool, len(a)+2), make([]bool, len(b)+2)
	ca, cb = pa[1:len(a)+1], pb[1:len(b)+1]

	xv, xidx := discardConfusing(ea, eb, len(ids)+1, ca)
	yv, yidx := discardConfusing(eb, ea, len(ids)+1, cb)
	s := &seq{xv: xv, yv: yv, xidx: xidx, yidx: yidx, xchg: ca, ychg: cb, off: len(yv) + 1}
	s.fd = make([]int, len(xv)+len(yv)+3)
	s.bd = make([]int, len(xv)+len(yv)+3)
	s.compare(0, len(xv), 0, len(yv))

	shiftBoundaries(pa, pb, ea, len(a))
	shiftBoundaries(pb, pa, eb, len(b))
	return ca, cb
}

// discardConfusing returns the lines of one file worth matching (and their
// real indexes), marking as changed those that match nothing in the other
// file, and those that match very many lines where they sit among such
// unmatched lines: matching them would only confuse the alignment.
func discardConfusing(mine, other []int, nclass int, changed []bool) (kept, realIdx []int) {
	counts := make([]int, nclass)
	for _, e := range other {
		counts[e]++
	}
	end := len(mine)
	many := 5
	for tem := end / 64 >> 2; tem > 0; tem >>= 2 {
		many *= 2
	}
	discards := make([]byte, end)
	for i, e := range mine {
		switch n := counts[e]; {
		case n == 0:
			discards[i] = 1
		case n > many:
			discards[i] = 2
		}
	}
	for i := 0; i < end; i++ {
		if discards[i] != 1 { // a provisional one outside a run goes
			discards[i] = 0
			continue
		}
		// A run of discardable lines that starts with a sure one.
		j, provisional := i, 0
		for ; j < end && discards[j] != 0; j++ {
			if discards[j] == 2 {
				provisional++
			}
		}
		for j > i && discards[j-1] == 2 {
			j--
			discards[j] = 0
			provisional--
		}
		length := j - i
		if provisional*4 > length {
			for j > i {
				j--
				if discards[j] == 2 {
					discards[j] = 0
				}
			}
			continue
		}
		minimum := 1
		for tem := length >> 4; tem > 0; tem >>= 2 {
			minimum <<= 1
		}
		minimum++
		consec := 0
		for j = 0; j < length; j++ {
			if discards[i+j] != 2 {
				consec = 0
			} else if consec++; consec == minimum {
				j -= consec
			} else if consec > minimum {
				discards[i+j] = 0
			}
		}
		// From each end of the run inwards, cancel the provisional
		// discards before three sure ones in a row, looking at most 8
		// lines in past a sure one.
		for _, at := range []func(j int) *byte{
			func(j int) *byte { return &discards[i+j] },
			func(j int) *byte { return &discards[i+length-1-j] },
		} {
			consec = 0
			for j := 0; j < length && consec < 3; j++ {
				if d := at(j); j >= 8 && *d == 1 {
					break
				} else if *d == 1 {
					consec++
				} else {
					consec, *d = 0, 0
				}
			}
		}
		i += length - 1
	}
	for i, e := range mine {
		if discards[i] == 0 {
			kept = append(kept, e)
			realIdx = append(realIdx, i)
		} else {
			changed[i] = true
		}
	}
	return kept, realIdx
}

// seq is the state of the middle-snake search over the kept lines.
type seq struct {
	xv, yv     []int
	xidx, yidx []int
	xchg, ychg []bool
	fd, bd     []int // furthest x on each diagonal, forward and backward, indexed by diagonal+off
	off        int
}

func (s *seq) compare(xoff, xlim, yoff, ylim int) {
	for xoff < xlim && yoff < ylim && s.xv[xoff] == s.yv[yoff] {
		xoff++
		yoff++
	}
	for xoff < xlim && yoff < ylim && s.xv[xlim-1] == s.yv[ylim-1] {
		xlim--
		ylim--
	}
	if xoff < xlim && yoff < ylim {
		if xmid, ymid, ok := s.middle(xoff, xlim, yoff, ylim); ok {
			s.compare(xoff, xmid, yoff, ymid)
			s.compare(xmid, xlim, ymid, ylim)
			return
		}
		// Too many differences to search for the shortest script (time
		// grows with their number times the length): show the range as
		// replaced rather than hang a dry run.
	}
	for ; xoff < xlim; xoff++ {
		s.xchg[s.xidx[xoff]] = true
	}
	for ; yoff < ylim; yoff++ {
		s.ychg[s.yidx[yoff]] = true
	}
}

// maxEditCost bounds the search of middle: beyond this many edit steps in
// one range the diff is no longer minimal. GNU diff switches to heuristics
// of its own at the same count for files below millions of lines, so up to
// here the two agree; files of key bundles never get near.
const maxEditCost = 4096

// middle finds the midpoint of a shortest edit script, searching from both
// ends at once.
func (s *seq) middle(xoff, xlim, yoff, ylim int) (xmid, ymid int, ok bool) {
	const maxInt = int(^uint(0) >> 1)
	fd := func(d int) *int { return &s.fd[d+s.off] }
	bd := func(d int) *int { return &s.bd[d+s.off] }
	dmin, dmax := xoff-ylim, xlim-yoff
	fmid, bmid := xoff-yoff, xlim-ylim
	fmin, fmax, bmin, bmax := fmid, fmid, bmid, bmid
	odd := (fmid-bmid)&1 != 0
	*fd(fmid) = xoff
	*bd(bmid) = xlim
	// grow widens a search's diagonals by one each way within [dmin, dmax]
	// (narrows them where it cannot), guarding the new outer ones.
	grow := func(lo, hi *int, at func(int) *int, guard int) {
		if *lo > dmin {
			*lo--
			*at(*lo - 1) = guard
		} else {
			*lo++
		}
		if *hi < dmax {
			*hi++
			*at(*hi + 1) = guard
		} else {
			*hi--
		}
	}
	for c := 1; c <= maxEditCost; c++ {
		grow(&fmin, &fmax, fd, -1)
		for d := fmax; d >= fmin; d -= 2 {
			x := max(*fd(d + 1), *fd(d - 1)+1)
			y := x - d
			for x < xlim && y < ylim && s.xv[x] == s.yv[y] {
				x++
				y++
			}
			*fd(d) = x
			if odd && bmin <= d && d <= bmax && *bd(d) <= x {
				return x, y, true
			}
		}
		grow(&bmin, &bmax, bd, maxInt)
		for d := bmax; d >= bmin; d -= 2 {
			x := min(*bd(d - 1), *bd(d + 1)-1)
			y := x - d
			for xoff < x && yoff < y && s.xv[x-1] == s.yv[y-1] {
				x--
				y--
			}
			*bd(d) = x
			if !odd && fmin <= d && d <= fmax && x <= *fd(d) {
				return x, y, true
			}
		}
	}
	return 0, 0, false
}

// shiftBoundaries slides each run of changed lines of one file (padded:
// index 0 and n+1 are sentinels) over equal neighbours, first back to
// merge with earlier runs, then forward as far as it goes, then back to
// line up with a run of changes in the other file, as diff does so that
// equal edits always print alike.
func shiftBoundaries(changed, otherChanged []bool, equivs []int, n int) {
	// Indexes below are of the unpadded arrays; ch(i) reads changed[i+1].
	ch := func(i int) *bool { return &changed[i+1] }
	oc := func(j int) bool { return otherChanged[j+1] }
	i, j := 0, 0
	for {
		for i < n && !*ch(i) {
			for oc(j) {
				j++
			}
			j++
			i++
		}
		if i == n {
			return
		}
		start := i
		for i++; *ch(i); i++ {
		}
		for oc(j) {
			j++
		}
		var corresponding int
		for {
			runlength := i - start
			for start > 0 && equivs[start-1] == equivs[i-1] {
				start--
				*ch(start) = true
				i--
				*ch(i) = false
				for *ch(start - 1) {
					start--
				}
				for j--; oc(j); j-- {
				}
			}
			corresponding = n
			if oc(j - 1) {
				corresponding = i
			}
			for i != n && equivs[start] == equivs[i] {
				*ch(start) = false
				start++
				*ch(i) = true
				i++
				for *ch(i) {
					i++
				}
				for j++; oc(j); j++ {
					corresponding = i
				}
			}
			if runlength == i-start {
				break
			}
		}
		for corresponding < i {
			start--
			*ch(start) = true
			i--
			*ch(i) = false
			for j--; oc(j); j-- {
			}
		}
	}
}
