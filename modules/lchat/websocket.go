package lchat

import (
	"bytes"
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/held"
)

// Held WebSockets (package held) around Caddy's reverse proxy: the writers that keep an
// instance's opt-in answer from the client (holdWriter) and stamp an acknowledgement
// (ackWriter), and the proxying of each kind of upgrade and event.

// holdWriter stands between Caddy's reverse proxy and the client for a WebSocket upgrade
// request: an instance answer that opts in (connhold.Opted) is kept, not written, so the
// box can complete the handshake itself; any other answer (a 101 and its tunnel included)
// passes through.
type holdWriter struct {
	http.ResponseWriter
	wrote  bool
	held   bool
	status int
	header http.Header
	body   bytes.Buffer
}

func (w *holdWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code) // informational: passed on, not the answer
		return
	}
	w.wrote = true
	if connhold.Opted(code, w.ResponseWriter.Header()) {
		w.held, w.status, w.header = true, code, w.ResponseWriter.Header().Clone()
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *holdWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.held {
		return w.ResponseWriter.Write(b)
	}
	if w.body.Len()+len(b) > connhold.MaxAnswer {
		return 0, errors.New("opt-in answer too large")
	}
	return w.body.Write(b)
}

// Flush passes on unless the answer is kept.
func (w *holdWriter) Flush() {
	if !w.held {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap lets Caddy's proxy hijack the connection for a tunnel.
func (w *holdWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ackWriter stamps a 2xx answer's header before it is written.
type ackWriter struct {
	http.ResponseWriter
	stamp func(http.Header)
	wrote bool
}

func (w *ackWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.wrote = true
		if code/100 == 2 {
			w.stamp(w.ResponseWriter.Header())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *ackWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *ackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instanceUpgrade proxies a WebSocket upgrade request to the instance with a fresh
// connection id; if the instance opts in, the box holds the connection and the request,
// with its Use, ends at once: a held connection does not keep the space awake.
func (p *proxying) instanceUpgrade(cs *held.Conns) error {
	id := connhold.NewID()
	p.r.Header.Set(connhold.ConnIDHeader, id)
	hw := &holdWriter{ResponseWriter: p.w}
	err := p.h.proxy.ServeHTTP(hw, p.r, p.next)
	if !hw.held {
		return err
	}
	return p.hold(hw, id, cs)
}

// instanceEvent, on the box with the instance, delivers an event a peer forwarded for a
// connection it holds (held.Conns.PeerEvent): refused with 409 and the stale instances
// when a replay must come first; otherwise its 2xx answer is stamped.
func (p *proxying) instanceEvent(use *engine.Use, cs *held.Conns) error {
	stamp, err := cs.PeerEvent(p.host, use, p.r.Header)
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
	return p.h.proxy.ServeHTTP(&ackWriter{ResponseWriter: p.w, stamp: stamp}, p.r, p.next)
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
	hw := &holdWriter{ResponseWriter: p.w}
	err = p.h.proxy.ServeHTTP(hw, p.r, p.next)
	if !hw.held {
		return err
	}
	track()
	p.w.WriteHeader(hw.status)
	_, err = p.w.Write(hw.body.Bytes())
	return err
}

// forwardUpgrade, on the entry box, forwards a client's upgrade with a fresh connection
// id, asking the peer to pass an opt-in answer back: the client's socket is then held
// here, whichever box runs the space now or later.
func (p *proxying) forwardUpgrade(fr *http.Request, cs *held.Conns) (held bool, err error) {
	id := connhold.NewID()
	fr.Header.Set(connhold.ConnIDHeader, id)
	fr.Header.Set(connhold.EntryHeader, p.h.app.box.Self())
	hw := &holdWriter{ResponseWriter: p.w}
	err = p.h.meshProxy.ServeHTTP(hw, fr, p.next)
	if !hw.held {
		return false, err
	}
	return true, p.hold(hw, id, cs)
}

// hold completes the handshake of a connection whose instance opted in (hw), and holds
// it on this box.
func (p *proxying) hold(hw *holdWriter, id string, cs *held.Conns) error {
	if err := cs.Accept(p.w, p.r, p.host, id, hw.header, hw.body.Bytes()); err != nil {
		return caddyhttp.Error(box.StatusOf(err), err)
	}
	return nil
}

// Interface guards
var (
	_ http.Flusher = (*holdWriter)(nil)
)
