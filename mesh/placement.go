package mesh

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// maxCachedOwners bounds the answers one view keeps (about 150 bytes each). Only hosts
// with a registry row reach placement, so this is a bound on a very large registry, not
// on what clients send; past it Owner still answers, by hashing, and the next view starts
// empty.
const maxCachedOwners = 1 << 20

// Placement answers Owner for one membership view at a time and caches each answer per
// (host, home region) until the view changes, so a request costs a map lookup instead of
// one hash per live member (HRW is linear in the fleet: about 50 µs at 1,000 members).
//
// Only what placement reads counts as a change: the set of members, their regions,
// domains and draining flags. A beat that finds the same fleet (ages and LastModified move on
// every beat) keeps the view, its generation and its cache; a join, a leave, a death, a
// drain or a region change starts a new generation with an empty cache. Each cached
// answer belongs to the view it was computed from, so an answer never outlives its view.
//
// SetView has one caller at a time (the membership loop); Owner is safe for any number
// of concurrent callers. The zero Placement has an empty view (Owner answers false).
type Placement struct {
	// Last, when set, names the box (its SELF) that host's space last woke on, "" when
	// unknown (Sizes.Box): Target keeps a space there while that box has room under the
	// loose bound (choose). Set it before the Placement is used. Nil: every last wake is
	// unknown.
	Last func(host string) string

	// setMu serializes SetView; readers never take it.
	setMu sync.Mutex
	cur   atomic.Pointer[placementView]
}

// placementView is one generation: an immutable copy of the members placement reads,
// and the answers computed from it.
type placementView struct {
	gen     uint64
	members []Member
	// loads is the members' published loads, replaced on every SetView, the same
	// generation or not (loads move on beats that keep the placement).
	loads atomic.Pointer[loadView]

	mu sync.RWMutex
	// owners maps (host, home region) to the host's ranking, nil when no member may own it.
	owners map[ownerKey]*ranking
	// groups interns the candidate sets of the rankings (few: one per scope of the fleet).
	groups map[uint64][]*group
}

type ownerKey struct{ host, homeRegion string }

// rankTop is how many of a host's candidates a ranking keeps in HRW order: bounded-load
// placement walks them, and only when none of them has room ranks the whole group.
const rankTop = 8

// ranking is one host's first candidates in HRW order, and the group they come from.
type ranking struct {
	top []int32
	g   *group
}

// group is one set of candidates, as indexes into the view's members.
type group struct {
	idx []int32
	// slot is the group's index in a loadView's sums.
	slot int
}

// loadView is the members' published loads, aligned with the view's members.
type loadView struct {
	warm, budget []int64
	awake        []int
	any          bool // some member publishes a warm set or a budget
	meanSize     int64

	mu   sync.Mutex
	sums []int64 // by group slot; -1 until computed
}

// sum is the warm set of g's members.
func (l *loadView) sum(g *group) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.sums) <= g.slot {
		l.sums = append(l.sums, -1)
	}
	if s := l.sums[g.slot]; s >= 0 {
		return s
	}
	var s int64
	for _, i := range g.idx {
		s += l.warm[i]
	}
	l.sums[g.slot] = s
	return s
}

func newLoadView(members []Member) *loadView {
	l := &loadView{warm: make([]int64, len(members)), budget: make([]int64, len(members)), awake: make([]int, len(members))}
	var warm int64
	var awake int
	for i := range members {
		l.warm[i], l.budget[i], l.awake[i] = max(members[i].WarmSet, 0), members[i].Budget, members[i].Awake
		l.any = l.any || members[i].WarmSet > 0 || members[i].Budget > 0
		warm += l.warm[i]
		awake += l.awake[i]
	}
	if awake > 0 {
		l.meanSize = warm / int64(awake)
	}
	return l
}

// SetView installs members (the live view, as Membership.Live returns it, sorted by Self)
// and reports whether placement changed, which starts a new generation. members is copied
// (and sorted by Self if it was not).
func (p *Placement) SetView(members []Member) (changed bool) {
	if !slices.IsSortedFunc(members, bySelf) {
		members = slices.SortedFunc(slices.Values(members), bySelf)
	}
	p.setMu.Lock()
	defer p.setMu.Unlock()
	old := p.cur.Load()
	if old != nil && samePlacement(old.members, members) {
		old.loads.Store(newLoadView(members))
		return false
	}
	v := &placementView{members: append([]Member(nil), members...), owners: map[ownerKey]*ranking{}, groups: map[uint64][]*group{}}
	v.loads.Store(newLoadView(members))
	if old != nil {
		v.gen = old.gen + 1
	} else {
		v.gen = 1
	}
	p.cur.Store(v)
	return true
}

// samePlacement reports whether a and b place every host alike because they hold the
// same members, in the same order, with the same regions and draining flags (and the
// same domains, which decide whether the owner holds a route; see Node.Place).
func samePlacement(a, b []Member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Self != b[i].Self || a[i].Region != b[i].Region || a[i].Draining != b[i].Draining ||
			!slices.Equal(a[i].Domains, b[i].Domains) {
			return false
		}
	}
	return true
}

func bySelf(a, b Member) int { return strings.Compare(a.Self, b.Self) }

// Has reports whether self is a member of the current view (draining or not), without
// copying the view.
func (p *Placement) Has(self string) bool {
	v := p.cur.Load()
	if v == nil {
		return false
	}
	_, ok := slices.BinarySearchFunc(v.members, self, func(m Member, s string) int { return strings.Compare(m.Self, s) })
	return ok
}

// Gen is the current view's generation: 0 before the first SetView, then one more for
// each SetView that changed placement.
func (p *Placement) Gen() uint64 {
	if v := p.cur.Load(); v != nil {
		return v.gen
	}
	return 0
}

// Len is the number of members in the current view.
func (p *Placement) Len() int {
	if v := p.cur.Load(); v != nil {
		return len(v.members)
	}
	return 0
}

// Owner is the package's Owner over the current view: the first call for a host in a
// view hashes, later calls in the same view read the cache. The member is as the view
// had it when its generation began: Self, Region, Domains and Draining hold for the whole
// generation, Age and LastModified are as of that listing.
func (p *Placement) Owner(host, homeRegion string) (owner Member, ok bool) {
	v := p.cur.Load()
	if v == nil {
		return Member{}, false
	}
	r := v.ranking(host, homeRegion)
	if r == nil {
		return Member{}, false
	}
	return v.members[r.top[0]], true
}

// Target is BoundedTarget over the current view and the loads of the last listing: where
// a space of size bytes that wakes goes (size <= 0: unknown, taken as the fleet's mean
// awake space), the box it last woke on named by Last. It costs a cache lookup and a walk of
// the host's first candidates; the host's ranking is computed once per view, like Owner's.
// When no member publishes a load, or eps <= 0, it is Owner.
func (p *Placement) Target(host, homeRegion string, size int64, eps float64) (Member, bool) {
	return p.target(host, homeRegion, size, eps, p.Last)
}

// TargetAfter is Target for a space that last woke on the box last (a SELF; "": unknown),
// whatever Last says.
func (p *Placement) TargetAfter(host, homeRegion string, size int64, last string, eps float64) (Member, bool) {
	return p.target(host, homeRegion, size, eps, func(string) string { return last })
}

func (p *Placement) target(host, homeRegion string, size int64, eps float64, lastFn func(string) string) (Member, bool) {
	v := p.cur.Load()
	if v == nil {
		return Member{}, false
	}
	r := v.ranking(host, homeRegion)
	if r == nil {
		return Member{}, false
	}
	l := v.loads.Load()
	if eps <= 0 || !l.any {
		return v.members[r.top[0]], true
	}
	if size <= 0 {
		size = l.meanSize
	}
	room := func(i int, bound float64) bool { return hasRoom(l.warm[i], l.budget[i], size, bound) }
	last := func() int {
		if lastFn == nil {
			return -1
		}
		self := lastFn(host)
		if self == "" {
			return -1
		}
		i, ok := slices.BinarySearchFunc(v.members, self, func(m Member, s string) int { return strings.Compare(m.Self, s) })
		if !ok {
			return -1
		}
		if _, in := slices.BinarySearch(r.g.idx, int32(i)); !in {
			return -1
		}
		return i
	}
	first := func(bound float64) int {
		for _, i := range r.top {
			if room(int(i), bound) {
				return int(i)
			}
		}
		if len(r.top) == len(r.g.idx) {
			return -1
		}
		// Every one of the first candidates is full: the rest of the group, by score
		// (rare, linear).
		h := NormalizeHost(host)
		best, bestScore := -1, uint64(0)
		for _, i := range r.g.idx {
			if slices.Contains(r.top, i) || !room(int(i), bound) {
				continue
			}
			s := Score(v.members[i].Self, h)
			if best < 0 || rankCmp(v.members, int(i), s, best, bestScore) < 0 {
				best, bestScore = int(i), s
			}
		}
		return best
	}
	lightest := func() int {
		// No candidate has room (rare, linear): the one with the smallest warm set, the
		// first in HRW order among equals.
		h := NormalizeHost(host)
		best, bestScore := -1, uint64(0)
		for _, i := range r.g.idx {
			if best >= 0 && l.warm[i] > l.warm[best] {
				continue
			}
			s := Score(v.members[i].Self, h)
			if best < 0 || l.warm[i] < l.warm[best] || rankCmp(v.members, int(i), s, best, bestScore) < 0 {
				best, bestScore = int(i), s
			}
		}
		return best
	}
	total, n := l.sum(r.g), len(r.g.idx)
	return v.members[choose(int(r.top[0]), last, room, first, lightest, boundOf(total, size, n, eps), boundOf(total, size, n+1, eps))], true
}

// ranking is host's cached ranking in this view, computed on first use; nil when no
// member may own the host.
func (v *placementView) ranking(host, homeRegion string) *ranking {
	k := ownerKey{host, homeRegion}
	v.mu.RLock()
	r, hit := v.owners[k]
	v.mu.RUnlock()
	if hit {
		return r
	}
	r = v.rank(host, homeRegion)
	v.mu.Lock()
	if r != nil {
		r.g = v.internLocked(r.g)
	}
	if len(v.owners) < maxCachedOwners {
		v.owners[k] = r
	}
	v.mu.Unlock()
	return r
}

// rank computes host's ranking: its candidates (Owner's), the first rankTop of them in
// HRW order. Its group is not interned yet.
func (v *placementView) rank(host, homeRegion string) *ranking {
	host = NormalizeHost(host)
	ms := v.members
	c := candidacyOf(host, ms, homeRegion)
	g := &group{}
	var top []int32
	var scores []uint64
	for i := range ms {
		if !c.eligible(&ms[i]) {
			continue
		}
		g.idx = append(g.idx, int32(i))
		s := Score(ms[i].Self, host)
		// Insert into the first rankTop, in HRW order.
		at := len(top)
		for at > 0 && rankCmp(ms, i, s, int(top[at-1]), scores[at-1]) < 0 {
			at--
		}
		if at >= rankTop {
			continue
		}
		top = slices.Insert(top, at, int32(i))
		scores = slices.Insert(scores, at, s)
		if len(top) > rankTop {
			top, scores = top[:rankTop], scores[:rankTop]
		}
	}
	if len(top) == 0 {
		return nil
	}
	return &ranking{top: top, g: g}
}

// internLocked returns the view's group with g's members, adding g when it is new. v.mu
// is held.
func (v *placementView) internLocked(g *group) *group {
	h := uint64(fnvOffset64)
	for _, i := range g.idx {
		h = (h ^ uint64(i)) * fnvPrime64
	}
	for _, old := range v.groups[h] {
		if slices.Equal(old.idx, g.idx) {
			return old
		}
	}
	g.slot = 0
	for _, gs := range v.groups {
		g.slot += len(gs)
	}
	v.groups[h] = append(v.groups[h], g)
	return g
}
