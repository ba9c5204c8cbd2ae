package held

import (
	"net/http"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/provider"
)

// Door is what a request reaching a space's instance is, for the held connections: which
// of the glue's proxyings carries it.
type Door int

const (
	// Plain: proxied as it is.
	Plain Door = iota
	// Reserved: a path under /.lchat/ that only the box's own events may reach: 404.
	Reserved
	// PeerEvent: an event a peer forwarded for a connection it holds (Conns.PeerEvent).
	PeerEvent
	// PeerUpgrade: an upgrade a peer forwarded for a client it will hold (Conns.PeerUpgrade).
	PeerUpgrade
	// Upgrade: a client's WebSocket upgrade, held here if the instance opts in.
	Upgrade
	// EventStream: a request for server-sent events, held here if resumable.
	EventStream
	// ClientPull: a fleet's entry box pulling what waits for it of a space hosted for
	// that fleet (Conns.ServePull).
	ClientPull
)

// FromClient readies a request from a client (not a peer's forward) to the box: the
// headers only a peer may send (connection ids, entry boxes) are removed, and a
// WebSocket handshake the box could not complete is refused (connhold.CheckHandshake,
// its answer's header on h; the caller answers 400) before it wakes a space. c is nil
// where connections cannot be held.
func (c *Conns) FromClient(r *http.Request, h http.Header) error {
	connhold.StripPeerHeaders(r.Header)
	r.Header.Del(connhold.ConnIDHeader)
	if c != nil && connhold.IsUpgrade(r) {
		return connhold.CheckHandshake(r, h)
	}
	return nil
}

// DoorOf decides what r, about to reach this box's instance after hops forwards, is, and
// removes what the instance must not see: the box's own requests to the instance
// (connection events) are under /.lchat/ and name connections, so no client can do
// either and an instance can trust both; a peer (a validly marked forward) sends the
// events and upgrades of the connections it holds. c is nil where connections cannot be
// held.
func (c *Conns) DoorOf(r *http.Request, hops int) Door {
	fromPeer := hops > 0 && c != nil
	peerEvent := fromPeer && r.Method == http.MethodPost && r.URL.Path == connhold.EventPath
	clientPull := fromPeer && r.Method == http.MethodPost && r.URL.Path == provider.PullPath &&
		isClientEntry(r.Header.Get(connhold.EntryHeader))
	if clientPull {
		return ClientPull
	}
	if connhold.Reserved(r.URL.Path) && !peerEvent {
		return Reserved
	}
	peerHolds := fromPeer && r.Header.Get(connhold.EntryHeader) != ""
	if !peerHolds {
		r.Header.Del(connhold.ConnIDHeader)
	}
	if !fromPeer {
		// A forward that fell back to serving here set them (an entry box's upgrade).
		connhold.StripPeerHeaders(r.Header)
	}
	switch {
	case peerEvent:
		return PeerEvent
	case peerHolds && connhold.IsUpgrade(r):
		return PeerUpgrade
	case c != nil && connhold.IsUpgrade(r):
		return Upgrade
	case c != nil && connhold.AcceptsEventStream(r):
		return EventStream
	}
	return Plain
}
