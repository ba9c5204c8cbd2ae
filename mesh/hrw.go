package mesh

// FNV-1a 64-bit parameters.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Score is the rendezvous weight of (member, host). It is FNV-1a 64 over the member's
// SELF, one zero byte, and the host, passed through the splitmix64 finalizer so that
// nearby inputs land far apart. The function is part of the mesh contract: every box of
// every version must compute the same value, so it must never change. Callers pass SELF
// as normalized by ParseSelf and the host as normalized by NormalizeHost.
func Score(self, host string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(self); i++ {
		h ^= uint64(self[i])
		h *= fnvPrime64
	}
	h *= fnvPrime64 // the zero separator byte: h ^= 0 is a no-op
	for i := 0; i < len(host); i++ {
		h ^= uint64(host[i])
		h *= fnvPrime64
	}
	return mix64(h)
}

// mix64 is the splitmix64 finalizer.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Owner picks the preferred owner of host among members, which the caller passes as the
// live view (Membership.Live). Draining members never own anything. The candidates are the
// members that hold the host's row: its host is under their domains or homeRegion is their
// region (RouteInScope, the rule replication fans rows out by), so in a fleet whose boxes
// cover different domains a host is never placed on a box that has no row or certificate
// for it. When no member holds it (heartbeats without domains, from older boxes), every
// member is a candidate, as before. When homeRegion is set and at least one candidate is of
// that region, only those compete; otherwise every candidate does, so a space whose region
// has no live box is still served somewhere. The highest Score wins; ties (astronomically
// rare) go to the lexically smaller SELF so every box agrees. ok is false when no member
// may own it (none, or all draining).
func Owner(host string, members []Member, homeRegion string) (owner Member, ok bool) {
	host = NormalizeHost(host)
	c := candidacyOf(host, members, homeRegion)
	var best uint64
	bestIdx := -1
	for i := range members {
		m := &members[i]
		if !c.eligible(m) {
			continue
		}
		s := Score(m.Self, host)
		if bestIdx < 0 || s > best || s == best && m.Self < members[bestIdx].Self {
			best, bestIdx = s, i
		}
	}
	if bestIdx < 0 {
		return Member{}, false
	}
	return members[bestIdx], true
}

// candidacy is which members compete for one host (see Owner): the rule Owner, the ranking
// bounded-load placement walks (Ranked) and the mean load it compares with all share it.
type candidacy struct {
	host, homeRegion string
	// holds: some live member holds the host's row; scoped: some candidate is of homeRegion.
	holds, scoped bool
}

// candidacyOf decides which of members compete for host (normalized), homed in homeRegion.
func candidacyOf(host string, members []Member, homeRegion string) candidacy {
	c := candidacy{host: host, homeRegion: homeRegion}
	for i := range members {
		m := &members[i]
		if !m.Draining && RouteInScope(host, homeRegion, m.Domains, m.Region) {
			c.holds = true
			c.scoped = c.scoped || homeRegion != "" && m.Region == homeRegion
		}
	}
	if !c.holds && homeRegion != "" {
		for i := range members {
			c.scoped = c.scoped || !members[i].Draining && members[i].Region == homeRegion
		}
	}
	return c
}

// eligible reports whether m competes for the host.
func (c candidacy) eligible(m *Member) bool {
	return !m.Draining && (!c.holds || RouteInScope(c.host, c.homeRegion, m.Domains, m.Region)) &&
		(!c.scoped || m.Region == c.homeRegion)
}
