package mesh

import (
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/registry"
)

// Action is what a box does with a request.
type Action int

// The actions.
const (
	// Serve: serve the request on this box.
	Serve Action = iota
	// Forward: proxy the request once to Decision.Peer.
	Forward
	// Unavailable: answer 503 with Retry-After; Decision.Reason says why.
	Unavailable
)

// Decision is where a request goes.
type Decision struct {
	Action Action
	// Peer is the SELF the request is forwarded to.
	Peer string
	// Hint: Peer is where the space was last seen awake (Holders), which may be stale;
	// the forward carries HintHeader.
	Hint bool
	// Fallback: when Peer cannot be dialed at all, nothing was sent, and the request
	// may be served here instead (the lease decides who runs the space).
	Fallback bool
	// Reason explains an Unavailable.
	Reason string
}

// Request is what placement knows of a request.
type Request struct {
	// Route is the host's registry row.
	Route *registry.Route
	// Hops is how many times the request was forwarded between boxes already (its
	// valid marker's hop; 0 from a client).
	Hops int
	// AwakeHere is set when the space is awake on this box.
	AwakeHere bool
	// ViaHint is set when the last forward followed a Holders entry (HintHeader).
	ViaHint bool
}

// Place decides where a request goes once its route is known.
//
// A live route pinned to another box is forwarded there, once: a request already
// forwarded that lands on a box that says the route lives elsewhere means the boxes'
// rows disagree until replication settles, and is unavailable for that moment.
//
// A hibernating space in this box's scope is served where it is awake: here when it is
// (even while this box drains: it serves the space until the drain puts it to sleep);
// else on the box it was last seen awake on (Holders), directly; else where it wakes: its
// HRW owner among the live boxes that are not draining, or, when that box has no room for
// it, the next box in the host's HRW order that has (bounded loads: Placement.Target,
// with the space's last known size, Node.Sizes), which wakes it or, finding its lease held, forwards once more to the
// holder (LeaseHeld). A request sent on a Holders entry that
// finds the space asleep (the entry went stale when it slept) goes on to where the space
// wakes by the same rule (bounded loads as this box sees them: this box itself while it
// has room and is where the space last woke), not wherever the entry pointed. A request
// forwarded twice is served where it lands, a hinted one too (an owner's entry): its last
// hop is kept for the lease holder this box may find. A forward to the holder or the
// owner may fall back to serving here when that box cannot be dialed.
//
// A route outside this box's scope (its host outside the mesh domains, homed in another
// region) is served here, as a single box would, unless it has a home region and its
// owner holds the row (homeOwner): then a row created on this box for another region still
// wakes in that region.
func (b *Node) Place(req Request) Decision {
	rt := req.Route
	if !rt.Hibernate {
		if rt.LivesAt == "" || rt.LivesAt == b.Self {
			return Decision{Action: Serve}
		}
		if req.Hops > 0 {
			return Decision{Action: Unavailable, Reason: fmt.Sprintf(
				"live route %s lives on %s, and this request was already forwarded once; the boxes' routes disagree until replication settles", rt.Host, rt.LivesAt)}
		}
		return Decision{Action: Forward, Peer: rt.LivesAt}
	}
	if req.AwakeHere || req.Hops >= 2 {
		// A request forwarded twice keeps its last hop for the lease holder it may find
		// here (LeaseHeld), hinted or not: sent on to where the space wakes, it would
		// reach that box with no forward left, a 503 when the space is awake elsewhere.
		return Decision{Action: Serve}
	}
	if !b.InScope(rt.Host, rt.HomeRegion) {
		// This box holds the row (it was created here) but takes no part in placing it.
		if req.Hops == 0 {
			if peer, ok := b.homeOwner(rt.Host, rt.HomeRegion); ok {
				return Decision{Action: Forward, Peer: peer, Fallback: true}
			}
		}
		return Decision{Action: Serve}
	}
	if holder := b.holder(rt.Host); holder != "" {
		return Decision{Action: Forward, Peer: holder, Hint: true, Fallback: true}
	}
	if req.Hops == 1 && !req.ViaHint && !b.draining() {
		return Decision{Action: Serve}
	}
	to, ok := b.target(rt.Host, rt.HomeRegion, b.sizeOf(rt.Host))
	if !ok || to.Self == b.Self {
		return Decision{Action: Serve}
	}
	return Decision{Action: Forward, Peer: to.Self, Fallback: true}
}

// holder is the live box other than this one that host's space was last seen awake on.
func (b *Node) holder(host string) string {
	if b.Holders == nil {
		return ""
	}
	self, ok := b.Holders.Get(host)
	if !ok || self == b.Self || !b.IsLiveMember(self) {
		return ""
	}
	return self
}

// LeaseHeld decides where a request goes when this box could not wake its space because
// holder holds the lease: forward to the holder (and remember it), unless the request
// has made its last forward, the holder is this box (a wake racing a sleep), or the
// holder is not a mesh SELF (a single box's id). The lease is read from the bucket, so
// this forward may go one past placement's (PlaceHops): a request forwarded to the
// holder a box read a moment ago, which finds the space moved on (a rolling restart
// hands it over between the two reads), still reaches the box that holds it now.
func (b *Node) LeaseHeld(host, holder string, hops int) Decision {
	if holder == b.Self || hops >= MaxHops {
		return Decision{Action: Unavailable, Reason: fmt.Sprintf("space %s is held by %s", host, holder)}
	}
	if _, err := ParseSelf(holder); err != nil {
		return Decision{Action: Unavailable, Reason: fmt.Sprintf("space %s is held by another box", host)}
	}
	if b.Holders != nil {
		b.Holders.Put(host, holder)
	}
	return Decision{Action: Forward, Peer: holder}
}

// Draining decides where a request goes that this draining box cannot serve (its space
// is asleep here, or was just put to sleep by the drain): to where it wakes among the
// boxes that are not draining (bounded loads, its size unknown here), which wakes it once
// this box has released its lease.
func (b *Node) Draining(host, homeRegion string, hops int) Decision {
	owner, ok := b.target(host, homeRegion, 0)
	if !ok || owner.Self == b.Self || hops >= PlaceHops || !b.InScope(host, homeRegion) {
		return Decision{Action: Unavailable, Reason: fmt.Sprintf("space %s: this box is shutting down", host)}
	}
	return Decision{Action: Forward, Peer: owner.Self}
}

// AtCap decides where a request goes whose space this box refused to wake at its
// max_awake cap (every space awake here in use): to where the space would wake were this
// box not a candidate (bounded loads over the other live boxes that compete for the host,
// with the space's last known size and the box it last woke on; the next HRW choice under
// plain HRW), which serves it as a forwarded request. It runs only on a refusal, so it
// ranks the live view afresh (linear in the fleet) rather than through Placement. Unavailable (the cap's 503) when the
// request has made its last forward, the host is outside this box's scope, or no other
// box competes for it. A box that is full as well forwards in its turn until the hops
// run out, so a full fleet costs a request at most PlaceHops forwards.
func (b *Node) AtCap(host, homeRegion string, hops int) Decision {
	if hops < PlaceHops && b.InScope(host, homeRegion) {
		// The host's candidates without this box (not the live boxes without it, which
		// could take a space out of its home region).
		live := b.Live()
		var others []Member
		for _, i := range Ranked(host, live, homeRegion) {
			if live[i].Self != b.Self {
				others = append(others, live[i])
			}
		}
		last := ""
		if b.Sizes != nil {
			last = b.Sizes.Box(host)
		}
		if to, ok := BoundedTarget(host, others, homeRegion, b.sizeOf(host), last, b.Balance); ok {
			return Decision{Action: Forward, Peer: to.Self}
		}
	}
	return Decision{Action: Unavailable, Reason: fmt.Sprintf("space %s: this box is at its max_awake cap", host)}
}

// MaxLeaseWait bounds how long a request waits for a space whose lease holder takes no
// connections (a drain that never ends, a box cut off from its peers only).
const MaxLeaseWait = 15 * time.Second

// leaseWaitBackoff spaces the tries of a request for a space whose lease holder could not
// be dialed (NextLeaseWait): 100ms, 200ms, 400ms, then 500ms each, until MaxLeaseWait.
var leaseWaitBackoff = backoff.Curve{First: 100 * time.Millisecond, Max: 500 * time.Millisecond}

// NextLeaseWait is how long a request waits, having waited waited already, before it
// tries again a space whose lease holder could not be dialed: a live box takes no
// connections while it restarts or shuts down (and frees each lease as its drain sleeps
// the space), and a dead one's lease frees with its heartbeat. The wait is the step of
// leaseWaitBackoff that follows the steps waited adds up to; 0 means give up
// (MaxLeaseWait reached).
func NextLeaseWait(waited time.Duration) time.Duration {
	step := leaseWaitBackoff.Next(0)
	for sum := step; sum <= waited; sum += step {
		step = leaseWaitBackoff.Next(step)
	}
	if waited+step > MaxLeaseWait {
		return 0
	}
	return step
}
