package lchat

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/mesh"
)

// peerAddrVar is the request variable the forward proxy dials: the peer's host:port.
const peerAddrVar = "lchat_peer_addr"

// newForwardProxy is Caddy's reverse proxy with the mesh's peer transport
// (box.PeerTransport): streaming, WebSockets, trailers and flushing behave as for any
// reverse_proxy.
func newForwardProxy(ctx caddy.Context, ms *box.Mesh, flush caddy.Duration) (*reverseproxy.Handler, error) {
	p := &reverseproxy.Handler{
		Upstreams:     reverseproxy.UpstreamPool{{Dial: "{http.vars." + peerAddrVar + "}"}},
		FlushInterval: flush,
		Transport:     ms.PeerTransport(func(err error) error { return reverseproxy.NewDialError(err) }),
	}
	if err := p.Provision(ctx); err != nil {
		return nil, fmt.Errorf("provisioning mesh forward proxy: %v", err)
	}
	return p, nil
}

// proxyDialError reports whether Caddy's reverse proxy failed to reach its upstream (a
// peer, an instance's socket) before anything was sent: its DialError, which the peer
// transport's box.DialError is wrapped in (newForwardProxy).
func proxyDialError(err error) bool {
	var de reverseproxy.DialError
	return errors.As(err, &de)
}

// Forward proxies the request once to the peer d names (box.Proxy).
func (p *proxying) Forward(d mesh.Decision) (box.Forwarded, error) {
	ms := p.h.app.box.Mesh()
	u, err := url.Parse(d.Peer)
	if err != nil {
		return box.Answered, caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("forward: bad peer URL"))
	}
	if p.hops == 0 && connhold.Reserved(p.r.URL.Path) {
		// As at the instance (Instance): a client never reaches the box's namespace.
		return box.Answered, p.reserved()
	}
	ms.C.Forwards.Add(1)
	caddyhttp.SetVar(p.r.Context(), peerAddrVar, mesh.DialAddr(u))
	fr := p.r.WithContext(box.WithPeer(p.r.Context(), box.Peer{Self: d.Peer, Hint: d.Hint, Hops: p.hops}))
	switch cs := p.h.app.conns; {
	case cs != nil && connhold.IsUpgrade(p.r) && p.r.Header.Get(connhold.EntryHeader) == "":
		// The client's socket is held here if the instance opts in (websocket.go). An
		// upgrade a peer forwarded for a client it holds itself goes on as it came (the
		// default below): held here, a box on the way, the entry box would only proxy the
		// socket, and close it with Caddy's 1001 when it stops instead of a held socket's
		// 1012.
		var held bool
		if held, err = p.forwardUpgrade(fr, cs); held {
			return box.Answered, err
		}
	case cs != nil && p.hops == 0 && connhold.AcceptsEventStream(p.r):
		// A resumable stream is held here, whichever box runs the space (sse.go).
		var res box.Forwarded
		if res, err = p.forwardSSE(fr, cs, p.h.meshProxy); res == box.Answered {
			return box.Answered, err
		}
	default:
		err = p.h.meshProxy.ServeHTTP(p.w, fr, p.next)
	}
	if err == nil {
		return box.Answered, nil
	}
	ms.C.ForwardErrors.Add(1)
	if box.RetrySafe(proxyDialError(err), p.r.Method, p.r.ContentLength, err) {
		return box.NotSent, err // box.Serve forgets the peer as the space's holder
	}
	return box.Answered, p.noAnswer(err, fmt.Sprintf("peer %s holding %s", d.Peer, p.host))
}
