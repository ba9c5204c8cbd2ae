package provider

import (
	"net/http"
	"time"

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
