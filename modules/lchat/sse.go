package lchat

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/held"
)

// sseWriter stands between Caddy's reverse proxy and the client for a request that asks
// for server-sent events. An answer that is not a resumable stream passes through
// untouched. A resumable one is passed on whole event by event (connhold.SSEEvents), its
// Use released at once (the stream does not keep the space awake), and the writer can be
// reopened on a later answer from the next instance: that answer's header is read, not
// written, and its events go on in the same client response.
type sseWriter struct {
	w           http.ResponseWriter
	hdr         http.Header // where the proxy puts the current answer's header
	sent        bool        // the client's header is written
	gotHeader   bool        // the current answer's status is in
	passthrough bool        // the first answer was not resumable
	resumable   bool        // the current answer is a resumable stream
	status      int         // the current answer's status; 0 before it
	keepMark    bool        // the answer goes to the entry box holding the stream: it keeps Lchat-Sse
	release     func()      // ends the current answer's Use
	ev          connhold.SSEEvents
}

func newSSEWriter(w http.ResponseWriter, release func()) *sseWriter {
	return &sseWriter{w: w, hdr: w.Header(), release: release}
}

func (s *sseWriter) Header() http.Header { return s.hdr }

func (s *sseWriter) WriteHeader(code int) {
	if code < 200 {
		if !s.sent {
			s.w.WriteHeader(code)
		}
		return
	}
	if s.gotHeader {
		return
	}
	s.gotHeader, s.status = true, code
	s.resumable = connhold.Resumable(code, s.hdr)
	if s.resumable {
		s.release()
	}
	if !s.sent {
		s.sent = true
		s.passthrough = !s.resumable
		if !s.keepMark {
			s.hdr.Del(connhold.SSEHeader)
		}
		s.w.WriteHeader(code)
	}
}

func (s *sseWriter) Write(b []byte) (int, error) {
	if !s.gotHeader {
		s.WriteHeader(http.StatusOK)
	}
	if s.passthrough {
		return s.w.Write(b)
	}
	if !s.resumable {
		return len(b), nil // a reopen answered with something else: the stream ends
	}
	out, err := s.ev.Feed(b)
	if err != nil {
		return 0, err
	}
	if len(out) > 0 {
		if _, err := s.w.Write(out); err != nil {
			return 0, err
		}
		http.NewResponseController(s.w).Flush()
	}
	return len(b), nil
}

// Flush passes on once the client's header is written: for an answer passed through,
// and for a resumable one, whose events are written whole (so a flush never sends half
// of one) and which must reach the client at once even before its first event, or an
// EventSource stays connecting until the first keepalive.
func (s *sseWriter) Flush() {
	if s.sent {
		http.NewResponseController(s.w).Flush()
	}
}

// Unwrap lets Caddy's proxy reach the client's writer (full duplex, deadlines).
func (s *sseWriter) Unwrap() http.ResponseWriter { return s.w }

// reopen readies the writer for the next instance's answer.
func (s *sseWriter) reopen(release func()) {
	s.ev.Cut()
	s.hdr, s.gotHeader, s.resumable, s.status, s.release = http.Header{}, false, false, 0, release
}

// comment writes raw stream text (a keepalive, a retry hint) between events.
func (s *sseWriter) comment(text string) error {
	if _, err := s.w.Write([]byte(text)); err != nil {
		return err
	}
	return http.NewResponseController(s.w).Flush()
}

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
		p.sse.release = use.Release
		return p.proxySSE(p.sse, p.r, p.h.proxy)
	}
	sw := newSSEWriter(p.w, use.Release)
	if p.hops > 0 && p.r.Header.Get(connhold.EntryHeader) != "" {
		connhold.StripPeerHeaders(p.r.Header)
		sw.keepMark = true
		return p.proxySSE(sw, p.r, p.h.proxy)
	}
	err := p.proxySSE(sw, p.r, p.h.proxy)
	if !sw.resumable || sw.passthrough {
		return err
	}
	cs.HoldSSE(p.r.Context(), p.host, &heldStream{p: p, sw: sw})
	return nil
}

// forwardSSE forwards a client's request for server-sent events to the peer d chose,
// asking it to leave a resumable stream to this box (connhold.EntryHeader), which holds
// it as it holds its own instances' (held.Conns.HoldSSE): the stream then follows the space from box
// to box. A reopen (p.sse) is one pass.
func (p *proxying) forwardSSE(fr *http.Request, cs *held.Conns) (box.Forwarded, error) {
	fr.Header.Set(connhold.EntryHeader, p.h.app.box.Self())
	if p.sse != nil {
		p.sse.release = func() {}
		return box.Answered, p.proxySSE(p.sse, fr, p.h.meshProxy)
	}
	sw := newSSEWriter(p.w, func() {})
	err := p.proxySSE(sw, fr, p.h.meshProxy)
	if !sw.sent {
		return box.NotSent, err
	}
	if !sw.resumable || sw.passthrough {
		return box.Answered, err
	}
	cs.HoldSSE(p.r.Context(), p.host, &heldStream{p: p, sw: sw})
	return box.Answered, nil
}

// heldStream is a resumable stream this box holds (held.Stream): each pass is a reopen
// of the client's request, proxied through the same writer.
type heldStream struct {
	p  *proxying
	sw *sseWriter
}

func (s *heldStream) Comment(text string) error { return s.sw.comment(text) }

func (s *heldStream) Pass() box.Proxy {
	sw, p := s.sw, s.p
	r2 := p.r.Clone(p.r.Context())
	if id, ok := sw.ev.LastID(); ok && id != "" {
		r2.Header.Set("Last-Event-ID", id)
	}
	r2.Header.Set(connhold.ReopenHeader, "1")
	sw.reopen(func() {})
	return &proxying{h: p.h, w: sw, r: r2, next: p.next, host: p.host, sse: sw}
}

func (s *heldStream) Answer() (int, bool) { return s.sw.status, s.sw.resumable }

// errStreamCut is proxySSE's error for a resumable stream its instance ended mid-way.
var errStreamCut = errors.New("event stream cut by its instance")

// proxySSE proxies r through sw. Caddy's proxy panics with http.ErrAbortHandler when the
// upstream ends a response it has begun (so that the client sees the response cut); a
// resumable stream is not cut: the box goes on with the next instance.
func (p *proxying) proxySSE(sw *sseWriter, r *http.Request, proxy *reverseproxy.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler && sw.resumable {
				err = errStreamCut
				return
			}
			panic(v)
		}
	}()
	return proxy.ServeHTTP(sw, r, p.next)
}
