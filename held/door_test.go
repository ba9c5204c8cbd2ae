package held

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/connhold"
)

// A client's WebSocket handshake as a browser sends it.
func handshake() http.Header {
	return http.Header{
		"Connection":            {"Upgrade"},
		"Upgrade":               {"websocket"},
		"Sec-Websocket-Key":     {"dGhlIHNhbXBsZSBub25jZQ=="},
		"Sec-Websocket-Version": {"13"},
	}
}

// peerRequest is a request carrying the headers only a box may send: a connection id, an
// earlier instance and a reopen mark, and, with entry, the entry box holding the client.
func peerRequest(method, path string, header http.Header, entry bool) *http.Request {
	r := httptest.NewRequest(method, "http://s1.example.com"+path, nil)
	for k, vs := range header {
		r.Header[k] = vs
	}
	r.Header.Set(connhold.ConnIDHeader, connhold.NewID())
	r.Header.Set(connhold.PriorHeader, "https://box-b.example.net inc-1 inst-1")
	r.Header.Set(connhold.ReopenHeader, "1")
	if entry {
		r.Header.Set(connhold.EntryHeader, boxtest.SelfB)
	}
	return r
}

// TestDoorOf: a request takes the door of what it is and of who sent it. Only a peer (a
// validly marked forward, hops > 0) to a box that holds connections reaches the event
// path, and only with an entry box does it keep the connection id and the entry box its
// door relies on; a client's request, and any request to a box that holds no
// connections, reaches the instance with none of the box-to-box headers.
func TestDoorOf(t *testing.T) {
	conns := openConns(t, boxtest.Open(t, boxtest.Options{}))
	var (
		id, entry, prior, reopen = connhold.ConnIDHeader, connhold.EntryHeader, connhold.PriorHeader, connhold.ReopenHeader
		all                      = []string{id, entry, prior, reopen}
		sse                      = http.Header{"Accept": {"text/event-stream"}}
	)
	for _, tc := range []struct {
		name         string
		conns        *Conns
		hops         int
		method, path string
		header       http.Header
		entry        bool
		want         Door
		// kept must still be on the request, gone must not (Reserved: refused, unchecked).
		kept, gone []string
	}{
		{name: "client's event", conns: conns, method: "POST", path: connhold.EventPath, entry: true, want: Reserved},
		{name: "client's event, no conns", method: "POST", path: connhold.EventPath, want: Reserved},
		{name: "peer's event", conns: conns, hops: 1, method: "POST", path: connhold.EventPath, entry: true,
			want: PeerEvent, kept: all},
		{name: "peer's event without entry box", conns: conns, hops: 2, method: "POST", path: connhold.EventPath,
			want: PeerEvent, kept: []string{prior}, gone: []string{id}},
		{name: "peer's event, no conns", hops: 1, method: "POST", path: connhold.EventPath, entry: true, want: Reserved},
		{name: "peer's GET of the event path", conns: conns, hops: 1, method: "GET", path: connhold.EventPath, entry: true,
			want: Reserved},
		{name: "peer's event on an uncleaned path", conns: conns, hops: 1, method: "POST", path: "/x/../.lchat/ws/event",
			entry: true, want: Reserved},
		{name: "client's other /.lchat/ path", conns: conns, method: "GET", path: "/.lchat/ws/conns", want: Reserved},
		{name: "peer's other /.lchat/ path", conns: conns, hops: 1, method: "POST", path: "/.lchat/ws/conns", entry: true,
			want: Reserved},
		{name: "peer's upgrade for its client", conns: conns, hops: 1, method: "GET", path: "/ws", header: handshake(),
			entry: true, want: PeerUpgrade, kept: all},
		{name: "peer's upgrade without entry box", conns: conns, hops: 1, method: "GET", path: "/ws", header: handshake(),
			want: Upgrade, gone: []string{id}},
		{name: "peer's upgrade, no conns", hops: 1, method: "GET", path: "/ws", header: handshake(), entry: true,
			want: Plain, gone: all},
		{name: "client's upgrade", conns: conns, method: "GET", path: "/ws", header: handshake(), want: Upgrade, gone: all},
		// An entry box whose forward fell back to serving here set them itself.
		{name: "client's upgrade with an entry box", conns: conns, method: "GET", path: "/ws", header: handshake(),
			entry: true, want: Upgrade, gone: all},
		{name: "client's upgrade, no conns", method: "GET", path: "/ws", header: handshake(), entry: true,
			want: Plain, gone: all},
		{name: "client's event stream", conns: conns, method: "GET", path: "/events", header: sse, entry: true,
			want: EventStream, gone: all},
		{name: "client's event stream, no conns", method: "GET", path: "/events", header: sse, want: Plain, gone: all},
		{name: "peer's event stream for its client", conns: conns, hops: 1, method: "GET", path: "/events", header: sse,
			entry: true, want: EventStream, kept: []string{entry}},
		{name: "client's GET", conns: conns, method: "GET", path: "/", entry: true, want: Plain, gone: all},
		{name: "peer's GET", conns: conns, hops: 1, method: "GET", path: "/", want: Plain, gone: []string{id}},
		{name: "client's POST with peer headers, no conns", method: "POST", path: "/form", entry: true,
			want: Plain, gone: all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := peerRequest(tc.method, tc.path, tc.header, tc.entry)
			if got := tc.conns.DoorOf(r, tc.hops); got != tc.want {
				t.Fatalf("DoorOf = %v, want %v", got, tc.want)
			}
			for _, k := range tc.kept {
				if r.Header.Get(k) == "" {
					t.Errorf("%s was removed", k)
				}
			}
			for _, k := range tc.gone {
				if v, ok := r.Header[k]; ok {
					t.Errorf("%s: %q reaches the instance", k, v)
				}
			}
		})
	}
}

// TestFromClient: a client's request loses every header only a peer may send, and a
// WebSocket handshake the box could not complete is refused before it wakes a space,
// naming the version the box speaks; a box that holds no connections proxies the
// handshake as it is.
func TestFromClient(t *testing.T) {
	conns := openConns(t, boxtest.Open(t, boxtest.Options{}))
	withHeader := func(k, v string) http.Header {
		h := handshake()
		h.Set(k, v)
		return h
	}
	for _, tc := range []struct {
		name    string
		conns   *Conns
		method  string
		header  http.Header
		refused bool
		version string // Sec-WebSocket-Version on the answer
	}{
		{name: "good handshake", conns: conns, method: "GET", header: handshake()},
		{name: "version 8", conns: conns, method: "GET", header: withHeader("Sec-Websocket-Version", "8"),
			refused: true, version: "13"},
		{name: "no version", conns: conns, method: "GET", header: withHeader("Sec-Websocket-Version", ""),
			refused: true, version: "13"},
		{name: "short key", conns: conns, method: "GET", header: withHeader("Sec-Websocket-Key", "c2hvcnQ="), refused: true},
		{name: "version 8, no conns", method: "GET", header: withHeader("Sec-Websocket-Version", "8")},
		{name: "short key, no conns", method: "GET", header: withHeader("Sec-Websocket-Key", "c2hvcnQ=")},
		{name: "plain POST", conns: conns, method: "POST"},
		{name: "plain POST, no conns", method: "POST"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := peerRequest(tc.method, "/ws", tc.header, true)
			answer := http.Header{}
			err := tc.conns.FromClient(r, answer)
			if (err != nil) != tc.refused {
				t.Fatalf("FromClient = %v, refused %v", err, tc.refused)
			}
			if got := answer.Get("Sec-Websocket-Version"); got != tc.version {
				t.Errorf("answer's Sec-WebSocket-Version = %q, want %q", got, tc.version)
			}
			for _, k := range []string{connhold.ConnIDHeader, connhold.EntryHeader, connhold.PriorHeader, connhold.ReopenHeader} {
				if v, ok := r.Header[k]; ok {
					t.Errorf("%s: %q reaches the box", k, v)
				}
			}
		})
	}
}
