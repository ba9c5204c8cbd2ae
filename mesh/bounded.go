package mesh

import "slices"

// Bounded-load placement ("Consistent Hashing with Bounded Loads", Mirrokni, Thorup and
// Zadimoghaddam, 2016; HAProxy's hash-balance-factor): a space that wakes goes to its HRW
// owner unless that box's warm set plus the space's size would pass (1+ε)× the mean warm
// set of the boxes that compete for the host (or the box's own budget); then to the next
// box in the host's HRW order that has room. The order is the host's, the loads are the
// listing's, so boxes with the same view agree. A box whose warm set is empty, or that
// stays under half its budget with the space, always has room: a space larger than the
// bound still lands somewhere, on the lightest box when no box has room; max_awake stays
// the hard cap on each box.
//
// Two bounds, so a join does not move what it need not (choose). A box takes a space
// that comes from elsewhere (a first wake, a move) only under the tight bound, the mean
// counted as if the fleet had one box more: (1+ε)× the candidates' warm set over n+1. A
// space that wakes again on the box it last woke on (SizeRecord.Box) needs only the loose
// bound, (1+ε)× the mean over n, which no box passes. A join lowers the mean by exactly
// that one box, so a box filled to the tight bound keeps every space it held: only the
// spaces whose HRW owner the new box is move, as with plain HRW. Without the two bounds the
// boxes sit at the bound, a join pushes every one of them past it, and in one listing's
// wakes each such box sheds every space that wakes: 3.6× plain HRW's moves at 10 boxes,
// 10× at 1,000, measured as TestBoundedLoadFigures measures (about 1× with the two).

// DefaultBalance is ε: no box takes a wake past 1.25× the mean warm set.
const DefaultBalance = 0.25

// hasRoom is the rule for one box: warm and budget are its published load, size the
// space's, bound one of choose's two (boundOf). A box that
// stays under half its budget with the space always has room: balance matters as boxes
// fill, and a load published a beat ago (a box that has just put this very space to sleep
// still counts it) must not move a space off its owner in a fleet with room everywhere.
func hasRoom(warm, budget, size int64, bound float64) bool {
	if warm <= 0 || budget > 0 && warm+size <= budget/2 {
		return true
	}
	if budget > 0 && warm+size > budget {
		return false
	}
	return float64(warm+size) <= bound
}

// boundOf is (1+eps)× the mean warm set of n candidates whose warm sets sum to total, once
// the space of size is counted: the loose bound with n, the tight bound with n+1.
func boundOf(total, size int64, n int, eps float64) float64 {
	return (1 + eps) * float64(total+size) / float64(n)
}

// choose is bounded-load placement's rule over one host's candidates, its one home
// (BoundedTarget and Placement.Target give it the candidates). owner is the HRW owner;
// last resolves the candidate the space last woke on, -1 when unknown or no longer a
// candidate (called only when the owner has no room under the tight bound); room(i, bound)
// reports whether candidate i has room for the space under bound (hasRoom); first(bound) is
// the first candidate in HRW order with room under bound, -1 when none has; lightest the
// candidate with the smallest warm set, the first in HRW order among equals. In order: the
// owner with room under the tight bound, or under the loose one when it is where the space
// last woke; the box the space last woke on, with room under the loose bound; the first
// box in HRW order with room under the tight bound, then under the loose one; when none has
// room (a space larger than ε× the mean), the lightest box, which holds no more than the
// mean: so no wake lands on a box already past the loose bound, unless that box is under
// half its budget.
func choose(owner int, last func() int, room func(i int, bound float64) bool, first func(bound float64) int, lightest func() int, loose, tight float64) int {
	if room(owner, tight) {
		return owner
	}
	if l := last(); l >= 0 && room(l, loose) {
		return l
	}
	if i := first(tight); i >= 0 {
		return i
	}
	if i := first(loose); i >= 0 {
		return i
	}
	return lightest()
}

// Ranked is the members that compete for host, homed in homeRegion (the candidates of
// Owner), as indexes into members in HRW order: highest Score first, ties to the smaller
// Self. Ranked(...)[0] is Owner's answer.
func Ranked(host string, members []Member, homeRegion string) []int {
	host = NormalizeHost(host)
	c := candidacyOf(host, members, homeRegion)
	type scored struct {
		i int
		s uint64
	}
	var all []scored
	for i := range members {
		if c.eligible(&members[i]) {
			all = append(all, scored{i, Score(members[i].Self, host)})
		}
	}
	slices.SortFunc(all, func(a, b scored) int { return rankCmp(members, a.i, a.s, b.i, b.s) })
	out := make([]int, len(all))
	for k, sc := range all {
		out[k] = sc.i
	}
	return out
}

// rankCmp orders two candidates by HRW: the higher score first, ties to the smaller Self.
func rankCmp(members []Member, i int, si uint64, j int, sj uint64) int {
	switch {
	case si > sj:
		return -1
	case si < sj:
		return 1
	case members[i].Self < members[j].Self:
		return -1
	case members[i].Self > members[j].Self:
		return 1
	}
	return 0
}

// BoundedOwner is BoundedTarget for a space whose last wake is unknown.
func BoundedOwner(host string, members []Member, homeRegion string, size int64, eps float64) (Member, bool) {
	return BoundedTarget(host, members, homeRegion, size, "", eps)
}

// BoundedTarget is where a space of size bytes that wakes goes, by the members' published
// loads (Member.WarmSet, Member.Budget) and last, the SELF of the box it last woke on ("":
// unknown): choose over the host's candidates in HRW order (Ranked); the owner when eps <= 0
// (plain HRW). It is the uncached form of Placement.Target, which
// the request path uses.
func BoundedTarget(host string, members []Member, homeRegion string, size int64, last string, eps float64) (Member, bool) {
	r := Ranked(host, members, homeRegion)
	if len(r) == 0 {
		return Member{}, false
	}
	if eps <= 0 {
		return members[r[0]], true
	}
	var total int64
	for _, i := range r {
		total += members[i].WarmSet
	}
	room := func(i int, bound float64) bool {
		return hasRoom(members[i].WarmSet, members[i].Budget, size, bound)
	}
	lastOf := func() int {
		if last == "" {
			return -1
		}
		for _, i := range r {
			if members[i].Self == last {
				return i
			}
		}
		return -1
	}
	first := func(bound float64) int {
		for _, i := range r {
			if room(i, bound) {
				return i
			}
		}
		return -1
	}
	lightest := func() int {
		best := r[0]
		for _, i := range r {
			if members[i].WarmSet < members[best].WarmSet {
				best = i
			}
		}
		return best
	}
	n := len(r)
	return members[choose(r[0], lastOf, room, first, lightest, boundOf(total, size, n, eps), boundOf(total, size, n+1, eps))], true
}
