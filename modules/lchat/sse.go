package lchat

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/held"
)

// instanceSSE proxies a request for server-sent events to this box's instance. A stream
// the instance marks resumable (connhold.Resumable) does not keep the space awake; when it
// ends with its instance, the client's response stays open (comment keepalives) until the
// space is awake again, here or on a peer, and the stream is reopened there with
// Last-Event-ID, as a browser would after a reconnect, without the client seeing a break
// (held.Conns.HoldSSE). A reopen answered otherwise (204: the instance ends the stream) ends the
// client's response. A stream a peer forwarded for the client it holds (connhold.EntryHeader)
// is that peer's to reopen: here it ends with its instance.
func (p *proxying) instanceSSE(use *engine.Use, cs *held.Conns) error {
	if p.sse != nil {
		// A reopen of a stream this box holds (heldStream).
		p.sse.SetRelease(use.Release)
		return p.proxySSE(p.sse, p.r, p.h.proxy, use)
	}
	if p.hops > 0 && p.r.Header.Get(connhold.EntryHeader) != "" {
		sw := held.NewSSEWriter(p.w, use.Release)
		connhold.StripPeerHeaders(p.r.Header)
		sw.KeepMark()
		return p.proxySSE(sw, p.r, p.h.proxy, use)
	}
	// Counted among the box's held connections from its first resumable answer.
	n := cs.CountStream(p.host)
	defer n.Done()
	sw := held.NewSSEWriter(p.w, func() { use.Release(); n.Start() })
	err := p.proxySSE(sw, p.r, p.h.proxy, use)
	if !sw.ToHold() {
		return err
	}
	cs.HoldSSE(p.r.Context(), p.host, &heldStream{SSEWriter: sw, p: p})
	return nil
}

// forwardSSE forwards a client's request for server-sent events through via (to the peer
// d chose, or to a delegated space's provider),
// asking it to leave a resumable stream to this box (connhold.EntryHeader), which holds
// it as it holds its own instances' (held.Conns.HoldSSE): the stream then follows the space from box
// to box. A reopen (p.sse) is one pass.
func (p *proxying) forwardSSE(fr *http.Request, cs *held.Conns, via *reverseproxy.Handler) (box.Forwarded, error) {
	fr.Header.Set(connhold.EntryHeader, p.h.app.box.Self())
	if p.sse != nil {
		p.sse.SetRelease(func() {})
		return box.Answered, p.proxySSE(p.sse, fr, via, nil)
	}
	n := cs.CountStream(p.host)
	defer n.Done()
	sw := held.NewSSEWriter(p.w, n.Start)
	err := p.proxySSE(sw, fr, via, nil)
	if !sw.Sent() {
		return box.NotSent, err
	}
	if !sw.ToHold() {
		return box.Answered, err
	}
	cs.HoldSSE(p.r.Context(), p.host, &heldStream{SSEWriter: sw, p: p})
	return box.Answered, nil
}

// heldStream is a resumable stream this box holds (held.Stream): each pass is a reopen
// of the client's request, proxied through the same writer.
type heldStream struct {
	*held.SSEWriter
	p *proxying
}

func (s *heldStream) Pass() box.Proxy {
	sw, p := s.SSEWriter, s.p
	r2 := p.r.Clone(p.r.Context())
	if id, ok := sw.LastID(); ok && id != "" {
		r2.Header.Set("Last-Event-ID", id)
	}
	r2.Header.Set(connhold.ReopenHeader, "1")
	sw.Reopen(func() {})
	return &proxying{h: p.h, w: sw, r: r2, next: p.next, host: p.host, sse: sw}
}

// errStreamCut is passSSE's error for a resumable stream its instance ended mid-way.
var errStreamCut = errors.New("event stream cut by its instance")

// proxySSE proxies r through sw, and through the output gate of use's wake before it (nil:
// a forward, gated where the space runs): each pass of a held stream through the gate of
// the instance it reaches.
func (p *proxying) proxySSE(sw *held.SSEWriter, r *http.Request, proxy *reverseproxy.Handler, use *engine.Use) error {
	var w http.ResponseWriter = sw
	if use != nil {
		if gw := p.gateWriter(use, sw, held.EventStream); gw != nil {
			w = gw
			defer gw.Finish()
		}
	}
	return passSSE(sw, w, r, proxy, p.next)
}

// passSSE proxies one pass of a stream through w: sw, or an output gate's writer in front
// of it. Caddy's proxy panics with http.ErrAbortHandler when the upstream ends a response
// it has begun (so that the client sees the response cut); a resumable stream is not cut:
// the box goes on with the next instance, even when the instance ended before its answer
// passed the gate (held.SSEWriter.Cut).
func passSSE(sw *held.SSEWriter, w http.ResponseWriter, r *http.Request, proxy *reverseproxy.Handler, next caddyhttp.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if sw.Cut(v) {
				err = errStreamCut
				return
			}
			panic(v)
		}
	}()
	return proxy.ServeHTTP(w, r, next)
}
