package mesh

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// maxCachedOwners bounds the answers one view keeps (about 100 bytes each). Only hosts
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
	// setMu serializes SetView; readers never take it.
	setMu sync.Mutex
	cur   atomic.Pointer[placementView]
}

// placementView is one generation: an immutable copy of the members placement reads,
// and the answers computed from it.
type placementView struct {
	gen     uint64
	members []Member

	mu sync.RWMutex
	// owners maps (host, home region) to the owner's index in members, or -1 for none.
	owners map[ownerKey]int32
}

type ownerKey struct{ host, homeRegion string }

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
		return false
	}
	v := &placementView{members: append([]Member(nil), members...), owners: map[ownerKey]int32{}}
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
	k := ownerKey{host, homeRegion}
	v.mu.RLock()
	i, hit := v.owners[k]
	v.mu.RUnlock()
	if !hit {
		i = -1
		if o, ok := ownerIndex(host, v.members, homeRegion); ok {
			i = int32(o)
		}
		v.mu.Lock()
		if len(v.owners) < maxCachedOwners {
			v.owners[k] = i
		}
		v.mu.Unlock()
	}
	if i < 0 {
		return Member{}, false
	}
	return v.members[i], true
}

// ownerIndex is Owner returning the owner's index in members.
func ownerIndex(host string, members []Member, homeRegion string) (int, bool) {
	o, ok := Owner(host, members, homeRegion)
	if !ok {
		return -1, false
	}
	for i := range members {
		if members[i].Self == o.Self {
			return i, true
		}
	}
	return -1, false
}
