package mesh

import "slices"

// Bounded-load placement ("Consistent Hashing with Bounded Loads", Mirrokni, Thorup and
// Zadimoghaddam, 2016; HAProxy's hash-balance-factor): a space that wakes goes to its HRW
// owner unless that box's warm set plus the space's size would pass (1+ε)× the mean warm
// set of the boxes that compete for the host (or the box's own budget); then to the next
// box in the host's HRW order that has room. The order is the host's, the loads are the
// listing's, so boxes with the same view agree. A box whose warm set is empty, or that
// stays under half its budget with the space, always has room: a space larger than the
// bound still lands somewhere, on its owner when every box is busy; max_awake stays the
// hard cap on each box.

// DefaultBalance is ε: no box takes a wake past 1.25× the mean warm set.
const DefaultBalance = 0.25

// hasRoom is the rule for one box: warm and budget are its published load, size the
// space's, bound (1+ε)× the mean warm set of the candidates counting the space. A box that
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

// boundOf is (1+eps)× the candidates' mean warm set once the space of size is counted.
func boundOf(total, size int64, n int, eps float64) float64 {
	return (1 + eps) * float64(total+size) / float64(n)
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

// BoundedOwner is where a space of size bytes that wakes goes, by the members' published
// loads (Member.WarmSet, Member.Budget): the first box in the host's HRW order (Ranked)
// with room under (1+eps)× the candidates' mean warm set and under its own budget; the HRW
// owner when none has room, or when eps <= 0 (plain HRW). It is the uncached form of
// Placement.Target, which the request path uses.
func BoundedOwner(host string, members []Member, homeRegion string, size int64, eps float64) (Member, bool) {
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
	bound := boundOf(total, size, len(r), eps)
	for _, i := range r {
		if hasRoom(members[i].WarmSet, members[i].Budget, size, bound) {
			return members[i], true
		}
	}
	return members[r[0]], true
}
