package lchat

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
)

// sseKeepalive is how often a resumable stream whose space sleeps gets a comment line, so
// that idle intermediaries keep it open (WHATWG HTML suggests about 15 s).
const sseKeepalive = 15 * time.Second

// sseRetry is the reconnection delay a stream ended by a shutting-down box asks for.
const sseRetry = "retry: 1000\n\n"

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
// (holdSSE). A reopen answered otherwise (204: the instance ends the stream) ends the
// client's response. A stream a peer forwarded for the client it holds (connhold.EntryHeader)
// is that peer's to reopen: here it ends with its instance.
func (p *proxying) instanceSSE(use *engine.Use, cs *conns) error {
	if p.sse != nil {
		// A reopen of a stream this box holds (holdSSE).
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
	return p.holdSSE(sw, cs)
}

// forwardSSE forwards a client's request for server-sent events to the peer d chose,
// asking it to leave a resumable stream to this box (connhold.EntryHeader), which holds
// it as it holds its own instances' (holdSSE): the stream then follows the space from box
// to box. A reopen (p.sse) is one pass.
func (p *proxying) forwardSSE(fr *http.Request, cs *conns) (box.Forwarded, error) {
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
	return box.Answered, p.holdSSE(sw, cs)
}

// sseProbe is how often a held stream whose space is not known to be awake tries a
// reopen anyway (one that never wakes the space): the announcement of a wake elsewhere
// may have been lost.
const sseProbe = 30 * time.Second

// holdSSE keeps a resumable stream's client response open across its instance's end and
// reopens it wherever the space is awake next, through the request path's one door
// (box.Serve): here, or on the peer that runs it. A reopen never wakes the space: here it
// is tried only while the space is awake here, and a peer answers 409 where it is not
// (connhold.ReopenHeader).
func (p *proxying) holdSSE(sw *sseWriter, cs *conns) error {
	ctx := p.r.Context()
	b := p.h.app.box
	wait := time.Second // the first try: the space may still be awake where the stream ended
	for {
		sw.ev.Cut()
		if !cs.awaitAwake(ctx, p.host, sw, wait) {
			return nil
		}
		wait = sseProbe
		rt, ok := b.Lookup(p.host)
		if !ok {
			return nil
		}
		r2 := p.r.Clone(ctx)
		if id, ok := sw.ev.LastID(); ok && id != "" {
			r2.Header.Set("Last-Event-ID", id)
		}
		r2.Header.Set(connhold.ReopenHeader, "1")
		sw.reopen(func() {})
		q := &proxying{h: p.h, w: sw, r: r2, next: p.next, host: p.host, sse: sw}
		switch at := cs.announcedAt(p.host); {
		case b.Engine().Awake(p.host):
			b.Serve(ctx, box.Request{Host: p.host}, q)
		case at != "" && at != b.Self():
			// Announced awake there (or it was, and answers 409).
			q.Forward(mesh.Decision{Action: mesh.Forward, Peer: at})
		default:
			// Where placement sends it; served here only while awake here.
			if d := b.Place(rt, 0, false); d.Action != mesh.Forward {
				continue
			}
			b.Serve(ctx, box.Request{Host: p.host}, q)
		}
		switch {
		case sw.status == 0 || sw.status == http.StatusConflict || sw.status == http.StatusServiceUnavailable:
			continue // nothing reached an instance, or the space is not awake there: wait
		case !sw.resumable:
			return nil
		}
		wait = time.Second
	}
}

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

// awaitAwake waits until host's space is awake here or announced awake at a peer, or
// until try has passed, writing keepalives to sw meanwhile; false when the client went
// away or the box is shutting down (the stream then ends with a retry hint, so the client
// reconnects to another box).
func (c *conns) awaitAwake(ctx context.Context, host string, sw *sseWriter, try time.Duration) bool {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastWrite := time.Now()
	deadline := time.Now().Add(try)
	for {
		woke := c.wakeSignal(host)
		if c.box.Engine().Awake(host) {
			// The stream ended with its space awake: the instance ended it, or is being
			// stopped. A moment's wait keeps an instance that ends its streams from being
			// called in a loop.
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Second):
			}
			if c.box.Engine().Awake(host) {
				return true
			}
			continue
		}
		select {
		case <-ctx.Done():
			return false
		case <-woke:
			return true
		case <-tick.C:
			if c.box.Mesh() != nil && time.Now().After(deadline) {
				return true
			}
			if caddy.Exiting() || c.closed() {
				sw.comment(sseRetry)
				return false
			}
			if time.Since(lastWrite) >= sseKeepalive {
				if sw.comment(": keepalive\n\n") != nil {
					return false
				}
				lastWrite = time.Now()
			}
		}
	}
}
