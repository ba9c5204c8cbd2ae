package lchat

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// Request variables of a forward.
const (
	peerAddrVar = "lchat_peer_addr" // host:port the forward dials
	peerSelfVar = "lchat_peer_self" // the peer's SELF URL
	hopsVar     = "lchat_mesh_hops" // int: forwards before this box, by the valid marker
	hintVar     = "lchat_mesh_hint" // bool: in: the last forward followed a holder entry; out: this one does
)

// peerTransport carries forwarded requests to peers. It dials the peer's address
// (its SELF) and, for an https SELF, verifies the peer's certificate against the
// instance hostname, the request's Host: the SNI and the verified name are the space's
// name, as they would be for a client that reached the peer directly. Idle connections
// are pooled per (peer, instance host), so a connection verified for one host is never
// reused for another. There is no way to skip verification.
type peerTransport struct {
	tr      *http.Transport
	marker  mesh.Marker
	holders *mesh.Holders
}

func newPeerTransport(ms *meshState) *peerTransport {
	pt := &peerTransport{marker: ms.marker}
	if ms.box != nil {
		pt.holders = ms.box.Holders
	}
	dialer := &net.Dialer{Timeout: ms.timeout, KeepAlive: 30 * time.Second}
	pt.tr = &http.Transport{
		// Never through an environment proxy: the peer's address is the point.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			peer, _, err := decodePoolKey(addr)
			if err != nil {
				return nil, err
			}
			conn, err := dialer.DialContext(ctx, "tcp", peer)
			if err != nil {
				return nil, reverseproxy.NewDialError(err)
			}
			return conn, nil
		},
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			peer, serverName, err := decodePoolKey(addr)
			if err != nil {
				return nil, err
			}
			conn, err := dialer.DialContext(ctx, "tcp", peer)
			if err != nil {
				return nil, reverseproxy.NewDialError(err)
			}
			tc := tls.Client(conn, &tls.Config{
				ServerName: serverName,
				RootCAs:    ms.roots,
				MinVersion: tls.VersionTLS12,
				NextProtos: []string{"http/1.1"},
			})
			hctx, cancel := context.WithTimeout(ctx, ms.timeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				conn.Close()
				err = fmt.Errorf("TLS handshake with peer %s as %s: %w", peer, serverName, err)
				var bad *tls.CertificateVerificationError
				if errors.As(err, &bad) {
					return nil, err
				}
				// The connection closed or timed out before a request was sent (the
				// peer is gone, behind a proxy or balancer that accepted for it): as
				// good as a failed dial.
				return nil, reverseproxy.NewDialError(err)
			}
			return tc, nil
		},
		// Pools are per (peer, instance host): bound the total too, or a box that
		// forwards for many hosts keeps a TLS connection open for each of them.
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		// A wake on the peer may take a while (restore, readiness), but a peer that
		// never answers must not hold the request, and its client, forever.
		ResponseHeaderTimeout: peerResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
	}
	return pt
}

// poolKey names an idle-connection pool: the peer address and, for TLS, the verified
// name. Hex keeps it a valid URL host whatever the inputs.
func poolKey(peer, serverName string) string {
	return hex.EncodeToString([]byte(peer + "|" + serverName))
}

func decodePoolKey(addr string) (peer, serverName string, err error) {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	raw, err := hex.DecodeString(host)
	if err != nil {
		return "", "", fmt.Errorf("forward: bad peer key")
	}
	peer, serverName, _ = strings.Cut(string(raw), "|")
	return peer, serverName, nil
}

// RoundTrip marks the request as forwarded one hop further (MAC over the instance host
// and the hop) and sends it to the peer chosen by the handler. The peer's answer names
// the box that served it from its awake instance (mesh.HolderHeader): that is
// remembered as where the space is awake, and the header goes no further than the box
// the client reached.
func (pt *peerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	self, _ := caddyhttp.GetVar(req.Context(), peerSelfVar).(string)
	u, err := url.Parse(self)
	if err != nil || self == "" {
		return nil, errors.New("forward: no peer chosen")
	}
	host := mesh.NormalizeHost(req.Host)
	hops := requestHops(req)
	pt.marker.MarkHop(req.Header, host, hops+1)
	if hint, _ := caddyhttp.GetVar(req.Context(), hintVar).(bool); hint {
		req.Header.Set(mesh.HintHeader, "1")
	} else {
		req.Header.Del(mesh.HintHeader)
	}
	addr := mesh.DialAddr(u)
	req.URL.Scheme = u.Scheme
	if u.Scheme == "https" {
		req.URL.Host = poolKey(addr, host)
	} else {
		req.URL.Host = poolKey(addr, "")
	}
	resp, err := pt.tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	// The box that served it from its awake instance says so: remember it (and the
	// header goes no further than the entry box).
	if holder, ok := mesh.TakeHolder(resp.Header, hops); ok && pt.holders != nil {
		pt.holders.Put(host, holder)
	}
	return resp, nil
}

// peerResponseHeaderTimeout bounds the wait for a forwarded request's response headers:
// longer than a wake's default readiness timeout plus a restore, far shorter than forever.
const peerResponseHeaderTimeout = 2 * time.Minute

// newForwardProxy is Caddy's reverse proxy with the peer transport: streaming,
// WebSockets, trailers and flushing behave as for any reverse_proxy.
func newForwardProxy(ctx caddy.Context, ms *meshState, flush caddy.Duration) (*reverseproxy.Handler, error) {
	p := &reverseproxy.Handler{
		Upstreams:     reverseproxy.UpstreamPool{{Dial: "{http.vars." + peerAddrVar + "}"}},
		FlushInterval: flush,
		Transport:     newPeerTransport(ms),
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
	ms := h.app.shared.mesh
	if ms == nil {
		if len(r.Header.Values(mesh.ForwardedHeader)) > 0 {
			r.Header.Del(mesh.ForwardedHeader)
		}
		return
	}
	had := len(r.Header.Values(mesh.ForwardedHeader)) > 0
	hint := r.Header.Get(mesh.HintHeader) != ""
	r.Header.Del(mesh.HintHeader)
	if hops := ms.marker.StripHops(r.Header, host); hops > 0 {
		ms.c.forwardedIn.Add(1)
		caddyhttp.SetVar(r.Context(), hopsVar, hops)
		caddyhttp.SetVar(r.Context(), hintVar, hint)
	} else if had {
		ms.c.markersStripped.Add(1)
	}
	r.Header.Del(mesh.ForwardedHeader)
}

// requestHops is how many times the request was forwarded before it reached this box
// (0: from a client).
func requestHops(r *http.Request) int {
	v, _ := caddyhttp.GetVar(r.Context(), hopsVar).(int)
	return v
}

// meshServe applies placement after the registry lookup (mesh.Box.Place). It reports
// whether it answered the request (by forwarding, or a 503); false means serve here.
func (h *Handler) meshServe(w http.ResponseWriter, r *http.Request, rt *registry.Route, next caddyhttp.Handler) (bool, error) {
	ms := h.app.shared.mesh
	if ms == nil {
		return false, nil
	}
	awake := rt.Hibernate && h.app.shared.eng.Awake(rt.Host)
	viaHint, _ := caddyhttp.GetVar(r.Context(), hintVar).(bool)
	d := ms.box.Place(mesh.Request{Route: rt, Hops: requestHops(r), AwakeHere: awake, ViaHint: viaHint})
	if d.Action == mesh.Unavailable {
		ms.c.livesAtLoops.Add(1)
	}
	return h.apply(w, r, d, next)
}

// meshServed notes, on the response to a forwarded request this box serves from its own
// awake instance, that the space is awake here, so the boxes that forwarded it send the
// next requests here directly.
func (h *Handler) meshServed(w http.ResponseWriter, r *http.Request) {
	if ms := h.app.shared.mesh; ms != nil && requestHops(r) > 0 {
		w.Header().Set(mesh.HolderHeader, ms.cfg.Self)
	}
}

// meshAcquireError handles a space this box cannot wake: its lease held by another
// live box (mesh.Box.LeaseHeld: forward to the holder), or this box draining
// (mesh.Box.Draining: forward to the owner that takes the space over). It reports
// whether it answered the request.
func (h *Handler) meshAcquireError(w http.ResponseWriter, r *http.Request, rt *registry.Route, err error, next caddyhttp.Handler) (bool, error) {
	ms := h.app.shared.mesh
	if ms == nil {
		return false, nil
	}
	var held *engine.LeaseHeldError
	var d mesh.Decision
	switch {
	case errors.As(err, &held):
		d = ms.box.LeaseHeld(rt.Host, held.Holder, requestHops(r))
	case errors.Is(err, engine.ErrDraining):
		d = ms.box.Draining(rt.Host, rt.HomeRegion, requestHops(r))
	default:
		return false, nil
	}
	if d.Action != mesh.Forward {
		ms.c.leaseBusy.Add(1)
		if c := h.logger.Check(zapcore.InfoLevel, "space unavailable: no forward left"); c != nil {
			c.Write(zap.String("host", rt.Host), zap.String("reason", d.Reason), zap.Int("hops", requestHops(r)))
		}
		return false, nil
	}
	ms.c.holderForwards.Add(1)
	done, ferr := h.apply(w, r, d, next)
	var de reverseproxy.DialError
	if errors.As(ferr, &de) || closedBeforeAnswer(r, ferr) {
		// Nothing was sent (or a bodiless GET/HEAD met a holder closing its connections
		// as it shut down, before any answer): the caller waits for the lease (meshLeaseWait) instead of
		// answering the 503 forward prepared.
		w.Header().Del("Retry-After")
		return true, fmt.Errorf("%w: %s: %v", errHolderUnreachable, d.Peer, ferr)
	}
	return done, ferr
}

// closedBeforeAnswer reports whether a bodiless GET or HEAD forwarded to a holder found
// its connection closed before any answer (the holder is shutting down): trying it again
// is safe.
func closedBeforeAnswer(r *http.Request, err error) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead || r.ContentLength > 0 {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// errHolderUnreachable means the box holding a space's lease could not be dialed;
// nothing was sent.
var errHolderUnreachable = errors.New("the space's box cannot be reached")

// meshLeaseWait sleeps before a request tries a space again whose lease holder could
// not be dialed (mesh.NextLeaseWait), and returns the total waited so far; 0 means give
// up.
func (h *Handler) meshLeaseWait(r *http.Request, waited time.Duration) time.Duration {
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

// apply carries out a placement decision.
func (h *Handler) apply(w http.ResponseWriter, r *http.Request, d mesh.Decision, next caddyhttp.Handler) (bool, error) {
	switch d.Action {
	case mesh.Forward:
		caddyhttp.SetVar(r.Context(), hintVar, d.Hint)
		return h.forward(w, r, d.Peer, next, d.Fallback)
	case mesh.Unavailable:
		setRetryAfter(w, time.Duration(h.RetryAfter))
		return true, caddyhttp.Error(http.StatusServiceUnavailable, errors.New(d.Reason))
	}
	return false, nil
}

// forward proxies the request once to the peer at self. When the peer cannot be
// dialed at all and fallback is set, nothing has been sent and the request is served
// here instead (the lease decides who runs the space).
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, self string, next caddyhttp.Handler, fallback bool) (bool, error) {
	ms := h.app.shared.mesh
	u, err := url.Parse(self)
	if err != nil {
		return true, caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("forward: bad peer URL"))
	}
	ms.c.forwards.Add(1)
	caddyhttp.SetVar(r.Context(), peerAddrVar, mesh.DialAddr(u))
	caddyhttp.SetVar(r.Context(), peerSelfVar, self)
	err = h.meshProxy.ServeHTTP(w, r, next)
	if err == nil {
		return true, nil
	}
	ms.c.forwardErrors.Add(1)
	// Nothing was sent when the peer could not be dialed; nothing was answered (and a
	// retry is safe) when a bodiless GET or HEAD met a peer closing its connections as it
	// shuts down. Caddy's proxy returns an error only before it writes a response.
	var de reverseproxy.DialError
	unanswered := errors.As(err, &de) || closedBeforeAnswer(r, err)
	if unanswered {
		// Whatever this box knew of where the space is awake is stale.
		ms.box.Holders.Forget(mesh.NormalizeHost(r.Host))
	}
	if fallback && unanswered {
		// Serve here: the lease decides who runs the space, and a box that still holds
		// it while shutting down is waited for (meshAcquireError, meshLeaseWait).
		ms.c.forwardFallback.Add(1)
		if c := h.logger.Check(zapcore.WarnLevel, "peer unreachable; serving here"); c != nil {
			c.Write(zap.String("host", r.Host), zap.String("peer", self), zap.Error(err))
		}
		return false, nil
	}
	// The peer was reached (or chosen) but gave no answer: it died, was stopped or cut
	// off while holding the request. That is the space being unavailable for a moment
	// (its lease frees with the holder's heartbeat), never a 502: answer 503 with
	// Retry-After. A write forwarded this way may or may not have been applied, as with
	// any lost answer.
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && (he.StatusCode == http.StatusBadGateway || he.StatusCode == http.StatusGatewayTimeout) {
		setRetryAfter(w, time.Duration(h.RetryAfter))
		return true, caddyhttp.Error(http.StatusServiceUnavailable, fmt.Errorf("peer %s holding %s gave no answer: %w", self, r.Host, he.Err))
	}
	return true, err
}

// Interface guards
var _ http.RoundTripper = (*peerTransport)(nil)
