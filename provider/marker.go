package provider

import (
	"fmt"
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

// PullPath is the path of a fleet's entry box's pull (POST, Lchat-Ws-Entry and
// Lchat-Sse-Reopen set, its body a listing of the WebSockets the entry box holds of the
// space): what the instance of a space hosted for the fleet sent, through its control
// endpoint, to the WebSockets the entry box holds, and the notices of what its
// checkpoints saved (docs/providers.md, "Held connections"). Under the box's namespace,
// so no client reaches it.
const PullPath = "/.lchat/ws/pull"

// The held-connection wire between a fleet's entry box and its provider (docs/providers.md,
// "Held connections of a delegated space": the events and their answers' headers, the
// pull's listing and its JSON lines, the entry box and reopen headers of a held stream or
// upgrade) has a version: the fleet sends WireHeader with WireVersion on every request of
// it (HeldRequest), the provider's box refuses one with another (CheckWire: 400, before
// anything acts on it) and sends its own on its answers, and the fleet takes no answer
// that acts on its held connections without it (Conn.RoundTrip).
const (
	WireHeader  = "Lchat-Held-Wire"
	WireVersion = "1"
)

// HeldRequest reports whether r, from a fleet's box to its provider, is of the
// held-connection wire: an event, a pull, or a request that names an entry box, a
// connection, a prior instance or a reopen.
func HeldRequest(r *http.Request) bool {
	h := r.Header
	return r.URL.Path == connhold.EventPath || r.URL.Path == PullPath || h.Get(connhold.EntryHeader) != "" ||
		h.Get(connhold.ReopenHeader) != "" || h.Get(connhold.ConnIDHeader) != "" || len(h.Values(connhold.PriorHeader)) > 0
}

// WireError is a request or an answer of the held-connection wire of another version
// than WireVersion ("" when it carries none).
type WireError struct {
	Of  string // "a fleet's request", "the provider's answer"
	Got string
}

func (e *WireError) Error() string {
	return fmt.Sprintf("%s of held-connection wire version %q; this box speaks %q", e.Of, e.Got, WireVersion)
}

// CheckWire is a *WireError for a fleet's request of the held-connection wire
// (HeldRequest) of another version than WireVersion, nil for any other. The provider's
// box answers it 400 (with its own WireHeader), before anything acts on it.
func CheckWire(r *http.Request) error {
	if got := r.Header.Get(WireHeader); HeldRequest(r) && got != WireVersion {
		return &WireError{Of: "a fleet's request", Got: got}
	}
	return nil
}

// ClientEntryPrefix begins the entry box a fleet's request names (Lchat-Ws-Entry), as
// the provider's box records it (ClientEntry): never an address this box calls, and
// never one of another client's.
const ClientEntryPrefix = "client/"

// ClientEntry is entry, named by client's request, as the provider's box records it.
func ClientEntry(client, entry string) string { return ClientEntryPrefix + client + "/" + entry }

// ClientRequest readies a request whose fleet's marker verified on this (the provider's)
// box. It counts as a forward from the fleet's entry box only for what the seam carries,
// the held connections that entry box keeps: an event stream (Lchat-Ws-Entry on a request
// for one, and Lchat-Sse-Reopen, kept), a WebSocket upgrade (Lchat-Ws-Entry and
// Lchat-Conn-Id, kept: the opt-in answer goes back to the fleet's box, which holds the
// socket), an event of such a WebSocket (POST connhold.EventPath with its entry,
// connection id and Lchat-Ws-Prior) and the entry box's pull (PullPath). Nothing else a
// peer of the mesh may send survives, and no other request under the box's own namespace
// (/.lchat/): false, the request is refused. The entry box named is the fleet's word
// only: the caller records it with ClientEntry, and the provider's box never calls it.
func ClientRequest(r *http.Request) bool {
	h := r.Header
	entry, reopen, id := h.Get(connhold.EntryHeader), h.Get(connhold.ReopenHeader), h.Get(connhold.ConnIDHeader)
	prior := h.Values(connhold.PriorHeader)
	event := r.Method == http.MethodPost && r.URL.Path == connhold.EventPath
	pull := r.Method == http.MethodPost && r.URL.Path == PullPath
	if connhold.Reserved(r.URL.Path) && !event && !pull {
		return false
	}
	connhold.StripPeerHeaders(h)
	h.Del(connhold.ConnIDHeader)
	switch {
	case event:
		if entry == "" || !connhold.ValidID(id) {
			return false
		}
		h.Set(connhold.EntryHeader, entry)
		h.Set(connhold.ConnIDHeader, id)
		for _, p := range prior {
			h.Add(connhold.PriorHeader, p)
		}
		return true
	case pull:
		if entry == "" {
			return false
		}
		h.Set(connhold.EntryHeader, entry)
		h.Set(connhold.ReopenHeader, "1")
		return true
	case connhold.IsUpgrade(r):
		if entry != "" && connhold.ValidID(id) {
			h.Set(connhold.EntryHeader, entry)
			h.Set(connhold.ConnIDHeader, id)
		}
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
