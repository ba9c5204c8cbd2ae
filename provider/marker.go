package provider

import (
	"net/http"
	"time"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/mesh"
)

// MarkerHeader carries the forwarded marker of the hop from a fleet to its provider: the
// mesh's marker value (mesh.Marker: a time and an HMAC-SHA256 over the host and the
// time), keyed with the fleet's token for that provider. The provider finds the client by
// the key that verifies it, and serves the request only if its route is hosted for that
// client (Client.Owns); it removes the header before anything else reads the request.
const MarkerHeader = "X-Lchat-Provider-Forwarded"

// Mark signs r's hop to p for host at now.
func (p *Provider) Mark(h http.Header, host string, now time.Time) {
	h.Set(MarkerHeader, mesh.Marker{Token: p.Token}.Sign(host, now))
}

// StripClient removes the provider marker from h and returns the client whose token
// signed it for host within the window (mesh.DefaultMarkerWindow, judged by now), or nil:
// none, malformed, stale or signed by no client. It runs on every request, so outside
// traffic can never pass for a client.
func (cs Clients) StripClient(h http.Header, host string, now time.Time) *Client {
	vals := h.Values(MarkerHeader)
	if len(vals) == 0 {
		return nil
	}
	h.Del(MarkerHeader)
	if len(vals) != 1 {
		return nil
	}
	clock := func() time.Time { return now }
	var found *Client
	for _, c := range cs {
		if (mesh.Marker{Token: c.Token, Now: clock}).Verify(vals[0], host) == nil {
			found = c
		}
	}
	return found
}

// ClientRequest readies a request whose fleet's marker verified on this (the provider's)
// box. It counts as a forward from the fleet's entry box only for what the seam carries:
// an event stream that entry box holds (Lchat-Ws-Entry on a request for one, and
// Lchat-Sse-Reopen, kept). Nothing else a peer of the mesh may send survives: no other
// held-connection header, no connection id, no upgrade held at the fleet's box (the
// provider's box holds the socket itself), so a fleet can never make this box call an
// address it names with this fleet's mesh token; and no request under the box's own
// namespace (/.lchat/, held-connection events): false, the request is refused.
func ClientRequest(r *http.Request) bool {
	if connhold.Reserved(r.URL.Path) {
		return false
	}
	h := r.Header
	entry, reopen := h.Get(connhold.EntryHeader), h.Get(connhold.ReopenHeader)
	connhold.StripPeerHeaders(h)
	h.Del(connhold.ConnIDHeader)
	if connhold.IsUpgrade(r) {
		return true
	}
	if entry != "" && connhold.AcceptsEventStream(r) {
		h.Set(connhold.EntryHeader, entry)
	}
	if reopen != "" {
		h.Set(connhold.ReopenHeader, reopen)
	}
	return true
}
