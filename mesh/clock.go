package mesh

import "time"

// Forwarding must neither loop nor depend on the boxes' wall clocks agreeing.
//
// Freshness of a forwarded marker is judged against the bucket's clock, which every box
// reads at each membership listing (the LIST response's Date): a box's estimate of the
// bucket's time is its own clock plus the offset it measured, so two boxes whose wall
// clocks differ by minutes still agree on a marker's age to within about a second (the
// Date header's resolution) plus the listing's latency. Before, boxes more than the
// marker window apart stripped each other's markers as stale, and while their views
// disagreed a request could bounce between them without end. (The hop count a marker
// carries bounds forwarding whatever the clocks say; see Marker.)

// bucketClock estimates the bucket's time from this box's wall clock and the offset last
// measured against a listing's Date.
type bucketClock struct {
	wall   func() time.Time
	offset time.Duration // bucket - wall, at the last listing that reported a Date
}

func (c bucketClock) now() time.Time { return c.wall().Add(c.offset) }

// wall is this box's wall clock: MembershipConfig.WallClock, else time.Now.
func (m *Membership) wall() time.Time {
	if m.cfg.WallClock != nil {
		return m.cfg.WallClock()
	}
	return time.Now()
}

// BucketNow estimates the bucket's current time: this box's wall clock plus the offset
// measured at the last listing (zero before the first). Forwarded markers are signed and
// checked with it, so boxes whose wall clocks disagree still agree on a marker's age.
func (m *Membership) BucketNow() time.Time {
	m.mu.Lock()
	c := m.clock
	m.mu.Unlock()
	if c.wall == nil {
		c.wall = m.wall
	}
	return c.now()
}
