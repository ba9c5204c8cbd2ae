package mesh

import (
	"fmt"

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
	// Forwarded is set when a peer validly marked the request: it was forwarded once.
	Forwarded bool
	// AwakeHere is set when the space is awake on this box.
	AwakeHere bool
}

// Place decides where a request goes once its route is known.
//
// A live route pinned to another box is forwarded there, once: a request already
// forwarded that lands on a box that says the route lives elsewhere means the boxes'
// rows disagree until replication settles, and is unavailable for that moment. A
// hibernating space in this box's scope goes to its HRW owner, unless it is awake here
// (a space stays where it is awake, unless this box drains: then it goes to the owner the
// peers now agree on, which waits for, or forwards to, this box's lease) or the request
// was already forwarded. A forward to the owner may fall back to serving here.
func (b *Box) Place(req Request) Decision {
	rt := req.Route
	if !rt.Hibernate {
		if rt.LivesAt == "" || rt.LivesAt == b.Self {
			return Decision{Action: Serve}
		}
		if req.Forwarded {
			return Decision{Action: Unavailable, Reason: fmt.Sprintf(
				"live route %s lives on %s, and this request was already forwarded once; the boxes' routes disagree until replication settles", rt.Host, rt.LivesAt)}
		}
		return Decision{Action: Forward, Peer: rt.LivesAt}
	}
	if !b.InScope(rt.Host, rt.HomeRegion) {
		return Decision{Action: Serve}
	}
	if req.Forwarded || req.AwakeHere && !b.draining() {
		return Decision{Action: Serve}
	}
	owner, ok := Owner(rt.Host, b.Live(), rt.HomeRegion)
	if !ok || owner.Self == b.Self {
		return Decision{Action: Serve}
	}
	return Decision{Action: Forward, Peer: owner.Self, Fallback: true}
}

// LeaseHeld decides where a request goes when this box could not wake its space because
// holder holds the lease: forward once to the holder, or unavailable when the request
// was already forwarded, the holder is this box (a wake racing a sleep), or the holder
// is not a mesh SELF (a single box's id).
func (b *Box) LeaseHeld(host, holder string, forwarded bool) Decision {
	switch {
	case forwarded || holder == b.Self:
		return Decision{Action: Unavailable, Reason: fmt.Sprintf("space %s is held by %s", host, holder)}
	}
	if _, err := ParseSelf(holder); err != nil {
		return Decision{Action: Unavailable, Reason: fmt.Sprintf("space %s is held by another box", host)}
	}
	return Decision{Action: Forward, Peer: holder}
}
