package mesh

import (
	"net/http"
	"strconv"
	"time"
)

// Forwarding must neither loop nor depend on the boxes' wall clocks agreeing.
//
// Freshness of a forwarded marker is judged against the bucket's clock, which every box
// reads at each membership listing (the LIST response's Date): a box's estimate of the
// bucket's time is its own clock plus the offset it measured, so two boxes whose wall
// clocks differ by minutes still agree on a marker's age to within about a second (the
// Date header's resolution) plus the listing's latency. Before, boxes more than the
// marker window apart stripped each other's markers as stale, and while their views
// disagreed a request could bounce between them without end.
//
// A hop count bounds forwarding whatever the clocks or views say: every forward adds one
// to HopsHeader, and a box never forwards a request that has made MaxHops hops already;
// it serves it (the lease decides who runs the space) or answers 503.

// HopsHeader counts the forwards a request has made between boxes.
const HopsHeader = "X-Lchat-Mesh-Hops"

// MaxHops is how many forwards a request may make. Placement forwards once (to the owner)
// and the lease may send it once more (to the holder); more means the boxes disagree.
const MaxHops = 2

// Hops reads a request's hop count: 0 when absent, MaxHops when it cannot be read (a
// header a box did not write is no reason to forward again).
func Hops(h http.Header) int {
	vals := h.Values(HopsHeader)
	if len(vals) == 0 {
		return 0
	}
	n, err := strconv.Atoi(vals[len(vals)-1])
	if len(vals) > 1 || err != nil || n < 0 || n > 64 {
		return MaxHops
	}
	return n
}

// CountHop sets the hop count of a request about to be forwarded.
func CountHop(h http.Header) {
	h.Set(HopsHeader, strconv.Itoa(Hops(h)+1))
}

// HopsExhausted reports whether a request may not be forwarded again.
func HopsExhausted(h http.Header) bool { return Hops(h) >= MaxHops }

// bucketClock estimates the bucket's time from this box's wall clock and the offset last
// measured against a listing's Date.
type bucketClock struct {
	wall   func() time.Time
	offset time.Duration // bucket - wall, at the last listing that reported a Date
}

func (c bucketClock) now() time.Time { return c.wall().Add(c.offset) }
