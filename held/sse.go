package held

import (
	"context"
	"net/http"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
)

// A Stream is one client's resumable event stream held by this box (connhold.Resumable):
// the glue's writer between Caddy's reverse proxy and the client.
type Stream interface {
	// Comment writes raw stream text between events: a keepalive, a retry hint.
	Comment(text string) error
	// Pass readies the stream for its next pass, a reopen with Last-Event-ID set from
	// its last event, and returns the door that carries it (box.Proxy).
	Pass() box.Proxy
	// Answer is how the last pass was answered: its status (0: nothing reached an
	// instance) and whether it was a resumable stream.
	Answer() (status int, resumable bool)
}

// A StreamCount counts one client's resumable event stream among the connections this
// box holds (connhold.Hub.StreamHeld: conns_streams, each space's streams), from its
// first resumable answer (Start) until the client's response ends (Done). The stream
// is counted at the box that holds the client's response, as a WebSocket is at its entry
// box: a box passing a stream on to the entry box that holds it does not count it. Its
// methods are called from the request's goroutine.
type StreamCount struct {
	hub  *connhold.Hub
	host string
	done func()
}

// CountStream is the count of one stream of host, not started.
func (c *Conns) CountStream(host string) *StreamCount {
	return &StreamCount{hub: c.hub, host: host}
}

// Start counts the stream; a second call does nothing.
func (s *StreamCount) Start() {
	if s.done == nil {
		s.done = s.hub.StreamHeld(s.host)
	}
}

// Done ends the count of a started stream.
func (s *StreamCount) Done() {
	if s.done != nil {
		s.done()
	}
}

// SSEKeepalive is how often a resumable stream whose space sleeps gets a comment line,
// so that idle intermediaries keep it open (WHATWG HTML suggests about 15 s).
const SSEKeepalive = 15 * time.Second

// SSERetry is the reconnection delay a stream ended by an exiting box asks for.
const SSERetry = "retry: 1000\n\n"

// sseProbe is how often a held stream whose space is not known to be awake tries a
// reopen anyway (one that never wakes the space): the announcement of a wake elsewhere
// may have been lost.
const sseProbe = 30 * time.Second

// delegatedProbe is how often one of the streams this box holds of a delegated space,
// waiting, tries a reopen anyway: the provider announces no wake, so a wake there with no
// request through the fleet (a scheduled one) is found by this probe. One stream per
// space probes (claimProbe); its reopen answered is the space awake there
// (provider.Conn.Answered), which reopens the others at once.
const delegatedProbe = 5 * time.Second

// claimProbe reports whether a stream of host, a delegated space, may probe now: no
// stream of it here did for delegatedProbe.
func (c *Conns) claimProbe(host string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.probed[host]) < delegatedProbe {
		return false
	}
	if c.probed == nil {
		c.probed = make(map[string]time.Time)
	}
	if len(c.probed) >= 4096 {
		for h, at := range c.probed {
			if now.Sub(at) >= delegatedProbe {
				delete(c.probed, h)
			}
		}
	}
	c.probed[host] = now
	return true
}

// HoldSSE keeps a resumable stream's client response open across its instance's end and
// reopens it wherever the space is awake next, through the request path's one door
// (box.Serve with Request.Reopen: here while it is awake here, else at the peer that
// announced it awake or where placement sends it, or at its provider; never a wake).
// A stream of a delegated space is also reopened at the probe of its space's streams
// (delegatedProbe). It returns when the
// stream ends: the client went away, a reopen was answered with something other than a
// resumable stream (the instance ended it), the route is gone, or the box is exiting
// (the stream then ends with a retry hint, so the client reconnects to another box).
func (c *Conns) HoldSSE(ctx context.Context, host string, s Stream) {
	wait := time.Second // the first try: the space may still be awake where the stream ended
	woke := c.wakeSignal(host)
	for {
		rt, ok := c.box.Lookup(host)
		if !ok {
			return
		}
		if !c.awaitAwake(ctx, host, s, wait, woke, rt.Provider != "") {
			return
		}
		// Taken before the reopen: a wake signalled while it is under way is not missed.
		woke = c.wakeSignal(host)
		wait = sseProbe
		if _, ok := c.box.Lookup(host); !ok {
			return
		}
		c.box.Serve(ctx, box.Request{Host: host, Reopen: true, AwakeAt: c.announcedAt(host)}, s.Pass())
		switch status, resumable := s.Answer(); {
		case status == 0 || status == http.StatusConflict || status == http.StatusServiceUnavailable:
			continue // nothing reached an instance, or the space is not awake there: wait
		case !resumable:
			return
		}
		// The pass was served, so the space was awake through it: a signal during it (its
		// own answer's, at a provider) says nothing of now. The first try comes soon.
		woke = c.wakeSignal(host)
		wait = time.Second
	}
}

// awaitAwake waits until host's space is awake here or announced awake at a peer (woke,
// its wake signal, is closed), or, with the mesh, until try has passed, or, delegated,
// until its streams' probe falls to this one (claimProbe), writing keepalives to s
// meanwhile; false when the client went away or the box is exiting or closed (the
// stream then ends with a retry hint).
func (c *Conns) awaitAwake(ctx context.Context, host string, s Stream, try time.Duration, woke <-chan struct{}, delegated bool) bool {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastWrite := time.Now()
	deadline := time.Now().Add(try)
	for {
		if c.box.Engine().Here(host) {
			// The stream ended with its space awake: the instance ended it, or is being
			// stopped. A moment's wait keeps an instance that ends its streams from being
			// called in a loop.
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Second):
			}
			if c.box.Engine().Here(host) {
				return true
			}
			continue
		}
		select {
		case <-ctx.Done():
			return false
		case <-woke:
			return true
		case <-c.box.Exiting():
			s.Comment(SSERetry)
			return false
		case now := <-tick.C:
			if c.box.Mesh() != nil && now.After(deadline) || delegated && c.claimProbe(host, now) {
				return true
			}
			if c.closed() {
				s.Comment(SSERetry)
				return false
			}
			if time.Since(lastWrite) >= SSEKeepalive {
				if s.Comment(": keepalive\n\n") != nil {
					return false
				}
				lastWrite = time.Now()
			}
		}
	}
}
