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

// Held WebSockets (package held) through Caddy's reverse proxies: each kind of upgrade
// and forwarded event is proxied through the writer held gives for it.

// instanceUpgrade proxies a WebSocket upgrade request to the instance with a fresh
// connection id; if the instance opts in, the box holds the connection and the request,
// with its Use, ends at once: a held connection does not keep the space awake.
func (p *proxying) instanceUpgrade(use *engine.Use, cs *held.Conns) error {
	id := connhold.NewID()
	p.r.Header.Set(connhold.ConnIDHeader, id)
	hw := held.NewHoldWriter(p.w)
	err := p.h.proxy.ServeHTTP(hw, p.r, p.next)
	if !hw.Held() {
		return err
	}
	if err := use.WaitDurable(p.r.Context()); err != nil {
		// The opt-in answer (and the messages it sends) waits for the commits before it.
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	return p.hold(hw, id, cs)
}

// instanceEvent, on the box with the instance, delivers an event a peer forwarded for a
// connection it holds (held.Conns.PeerEvent): refused with 409 and the stale instances
// when a replay must come first; otherwise its 2xx answer is stamped.
func (p *proxying) instanceEvent(use *engine.Use, cs *held.Conns) error {
	aw, err := cs.PeerEvent(p.host, use, p.w, p.r.Header)
	var re *connhold.ReplayError
	switch {
	case errors.As(err, &re):
		for _, s := range re.Stale {
			p.w.Header().Add(connhold.ReplayHeader, s.String())
		}
		p.w.WriteHeader(http.StatusConflict)
		return nil
	case err != nil:
		return caddyhttp.Error(box.StatusOf(err), err)
	}
	return p.h.proxy.ServeHTTP(aw, p.r, p.next)
}

// instanceUpgradeForEntry, on the box with the instance, proxies an upgrade a peer
// forwarded for a client it will hold itself (held.Conns.PeerUpgrade): an opt-in answer
// is passed back to the entry box as it is (it completes the handshake), any other
// answer (a 101 and its tunnel) as today.
func (p *proxying) instanceUpgradeForEntry(use *engine.Use, cs *held.Conns) error {
	track, err := cs.PeerUpgrade(p.host, use, p.r.Header)
	if err != nil {
		return caddyhttp.Error(box.StatusOf(err), err)
	}
	hw := held.NewHoldWriter(p.w)
	err = p.h.proxy.ServeHTTP(hw, p.r, p.next)
	if !hw.Held() {
		return err
	}
	status, header, body := hw.Answer()
	track(header)
	p.w.WriteHeader(status)
	_, err = p.w.Write(body)
	return err
}

// forwardUpgrade, on the entry box, forwards a client's upgrade to the peer the box
// chose (forwardUpgradeVia).
func (p *proxying) forwardUpgrade(fr *http.Request, cs *held.Conns) (kept bool, err error) {
	return p.forwardUpgradeVia(fr, cs, p.h.meshProxy)
}

// forwardUpgradeVia forwards a client's upgrade with a fresh connection id through via
// (to a peer, or to a delegated space's provider), asking it to pass an opt-in answer
// back: the client's socket is then held here, whichever box runs the space now or
// later.
func (p *proxying) forwardUpgradeVia(fr *http.Request, cs *held.Conns, via *reverseproxy.Handler) (kept bool, err error) {
	id := connhold.NewID()
	fr.Header.Set(connhold.ConnIDHeader, id)
	fr.Header.Set(connhold.EntryHeader, p.h.app.box.Self())
	hw := held.NewHoldWriter(p.w)
	err = via.ServeHTTP(hw, fr, p.next)
	if !hw.Held() {
		return false, err
	}
	return true, p.hold(hw, id, cs)
}

// hold completes the handshake of a connection whose instance opted in (hw), and holds
// it on this box.
func (p *proxying) hold(hw *held.HoldWriter, id string, cs *held.Conns) error {
	_, header, body := hw.Answer()
	if err := cs.Accept(p.w, p.r, p.host, id, header, body); err != nil {
		return caddyhttp.Error(box.StatusOf(err), err)
	}
	return nil
}
