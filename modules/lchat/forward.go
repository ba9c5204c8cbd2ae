package lchat

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// Request variables of a forward.
const (
	peerAddrVar = "lchat_peer_addr" // host:port the forward dials
	hopsVar     = "lchat_mesh_hops" // int: forwards before this box, by the valid marker
	hintVar     = "lchat_mesh_hint" // bool: the last forward followed a holder entry
)

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

// meshStrip runs first on every request: an invalid forwarded marker is removed, so
// outside traffic can neither spoof nor suppress forwarding. A valid one is noted in
// the request's variables and removed too, so the instance never sees it.
func (h *Handler) meshStrip(r *http.Request, host string) {
	ms := h.app.box.Mesh()
	if ms == nil {
		if len(r.Header.Values(mesh.ForwardedHeader)) > 0 {
			r.Header.Del(mesh.ForwardedHeader)
		}
		return
	}
	had := len(r.Header.Values(mesh.ForwardedHeader)) > 0
	hint := r.Header.Get(mesh.HintHeader) != ""
	r.Header.Del(mesh.HintHeader)
	if hops := ms.Marker().StripHops(r.Header, host); hops > 0 {
		ms.C.ForwardedIn.Add(1)
		caddyhttp.SetVar(r.Context(), hopsVar, hops)
		caddyhttp.SetVar(r.Context(), hintVar, hint)
	} else if had {
		ms.C.MarkersStripped.Add(1)
	}
	r.Header.Del(mesh.ForwardedHeader)
}

// requestHops is how many times the request was forwarded before it reached this box
// (0: from a client).
func requestHops(r *http.Request) int {
	v, _ := caddyhttp.GetVar(r.Context(), hopsVar).(int)
	return v
}

// place carries out the request's placement (box.Box.Place). It reports whether it
// answered the request (by forwarding, or a 503); false means serve here.
func (h *Handler) place(w http.ResponseWriter, r *http.Request, rt *registry.Route, next caddyhttp.Handler) (bool, error) {
	viaHint, _ := caddyhttp.GetVar(r.Context(), hintVar).(bool)
	d := h.app.box.Place(rt, requestHops(r), viaHint)
	switch d.Action {
	case mesh.Unavailable:
		setRetryAfter(w, time.Duration(h.RetryAfter))
		return true, caddyhttp.Error(http.StatusServiceUnavailable, errors.New(d.Reason))
	case mesh.Forward:
		res, err := h.forward(w, r, d, next)
		if res == answered {
			return true, err
		}
		if !d.Fallback {
			setRetryAfter(w, time.Duration(h.RetryAfter))
			return true, caddyhttp.Error(http.StatusServiceUnavailable, fmt.Errorf("peer %s for %s cannot be reached: %w", d.Peer, r.Host, err))
		}
		// Serve here: the lease decides who runs the space, and a box that still holds
		// it while shutting down is waited for (ServeHTTP's lease wait).
		h.app.box.Mesh().C.ForwardFallback.Add(1)
		if c := h.logger.Check(zapcore.WarnLevel, "peer unreachable; serving here"); c != nil {
			c.Write(zap.String("host", r.Host), zap.String("peer", d.Peer), zap.Error(err))
		}
	}
	return false, nil
}

// meshServed notes, on the response to a forwarded request this box serves from its own
// awake instance, that the space is awake here, so the boxes that forwarded it send the
// next requests here directly.
func (h *Handler) meshServed(w http.ResponseWriter, r *http.Request) {
	if requestHops(r) > 0 {
		w.Header().Set(mesh.HolderHeader, h.app.box.Self())
	}
}

// forwardResult is what a forward to a peer came to.
type forwardResult int

const (
	// answered: the request was carried to the peer; the error (nil: the peer's own
	// answer was sent) is the request's answer.
	answered forwardResult = iota
	// notSent: nothing reached the peer that could have acted on it (box.RetrySafe):
	// the caller may try again or serve here; the error says why.
	notSent
)

// forward proxies the request once to the peer d names.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, d mesh.Decision, next caddyhttp.Handler) (forwardResult, error) {
	ms := h.app.box.Mesh()
	u, err := url.Parse(d.Peer)
	if err != nil {
		return answered, caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("forward: bad peer URL"))
	}
	ms.C.Forwards.Add(1)
	caddyhttp.SetVar(r.Context(), peerAddrVar, mesh.DialAddr(u))
	fr := r.WithContext(box.WithPeer(r.Context(), box.Peer{Self: d.Peer, Hint: d.Hint, Hops: requestHops(r)}))
	err = h.meshProxy.ServeHTTP(w, fr, next)
	if err == nil {
		return answered, nil
	}
	ms.C.ForwardErrors.Add(1)
	var de reverseproxy.DialError
	if box.RetrySafe(errors.As(err, &de), r.Method, r.ContentLength, err) {
		// Whatever this box knew of where the space is awake is stale.
		ms.Box().Holders.Forget(mesh.NormalizeHost(r.Host))
		return notSent, err
	}
	return answered, h.noAnswer(w, err, fmt.Sprintf("peer %s holding %s", d.Peer, r.Host))
}

// leaseWait sleeps before a request tries a space again whose lease holder could not be
// reached (mesh.NextLeaseWait), and returns the total waited so far; 0 means give up.
func leaseWait(r *http.Request, waited time.Duration) time.Duration {
	step := mesh.NextLeaseWait(waited)
	if step == 0 {
		return 0
	}
	select {
	case <-r.Context().Done():
		return 0
	case <-time.After(step):
	}
	return waited + step
}
