package box

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// The request path: Serve decides what becomes of one request, the handler
// (modules/lchat) carries each decision out with Caddy's reverse proxy (Proxy).

// Request is what Serve knows of one request.
type Request struct {
	// Host is the request's host, normalized (lowercase, no port, no trailing dot).
	Host string
	// Hops is how many times the request was forwarded before it reached this box, by
	// its valid marker (Strip); 0 from a client.
	Hops int
	// ViaHint: the last forward followed a holder entry (mesh.HintHeader, Strip).
	ViaHint bool
	// Reopen marks the reopen of an event stream this box holds (package held), or one
	// a peer holds (Hops > 0): it never wakes the space. It is served here only while
	// the space is awake here; else, from a client's box, it goes to AwakeAt (a peer
	// that announced the space awake) or where placement sends it; otherwise it is
	// refused with 409.
	Reopen bool
	// AwakeAt is the peer that last announced the space awake, for a Reopen.
	AwakeAt string
	// Client, on a provider's box, is the fleet whose forwarded marker the request
	// carries (provider.Clients.StripClient); it counts as one hop.
	Client string
}

// Proxy carries out Serve's decisions for one request.
type Proxy interface {
	// Forward proxies the request once to the peer d names.
	Forward(d mesh.Decision) (Forwarded, error)
	// Live proxies the request to a live route's upstream.
	Live(upstream string) error
	// Instance proxies the request to the awake instance use holds; it returns when the
	// response, or the connection it upgraded to, is finished.
	Instance(use *engine.Use) error
	// Refuse answers the request with ref: its status, with Retry-After when it is a 503
	// (ref.RetryAfter, or the handler's default when 0), and its error.
	Refuse(ref Refusal) error
}

// Forwarded is what a forward to a peer came to.
type Forwarded int

const (
	// Answered: the request was carried to the peer; Forward's error (nil: the peer's
	// own answer was sent) is the request's answer.
	Answered Forwarded = iota
	// NotSent: nothing reached the peer that could have acted on it (RetrySafe), and
	// nothing was written: the request may be served here or tried again.
	NotSent
)

// Serve decides what becomes of one request, in one pass: an unknown host is 404; the
// route is placed (Place: here, forwarded, or a 503); a live route goes to its upstream; a
// hibernating one is woken here if asleep (Acquire) and proxied to its instance, or,
// when this box cannot wake it (AcquireFailed: its lease held by a live peer, this box
// draining), forwarded to the box that can. A forward that reaches nothing falls back to
// serving here when its decision allows it; one to a lease holder that takes no
// connections waits and tries again (mesh.NextLeaseWait), up to mesh.MaxLeaseWait.
func (b *Box) Serve(ctx context.Context, req Request, p Proxy) error {
	rt, ok := b.reg.Lookup(req.Host)
	if !ok {
		return p.Refuse(Refusal{Status: http.StatusNotFound, Err: fmt.Errorf("no route for host %q", req.Host)})
	}
	if rt.Delegated() || rt.HostedFor != "" {
		if err, done := b.serveProvided(rt, req, p); done {
			return err
		}
	}
	d := b.Place(rt, req.Hops, req.ViaHint)
	if req.Reopen {
		if d = b.placeReopen(rt, req, d); d.Action == mesh.Unavailable {
			return p.Refuse(Refusal{Status: http.StatusConflict, Err: fmt.Errorf("space %s is not awake here", rt.Host)})
		}
	}
	switch d.Action {
	case mesh.Unavailable:
		return p.Refuse(Refusal{Status: http.StatusServiceUnavailable, Err: errors.New(d.Reason)})
	case mesh.Forward:
		res, err := b.forward(p, rt.Host, d)
		if res == Answered {
			return err
		}
		if !d.Fallback || req.Reopen {
			return p.Refuse(Refusal{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("peer %s for %s cannot be reached: %w", d.Peer, rt.Host, err)})
		}
		// Serve here: the lease decides who runs the space, and a box that still holds
		// it while shutting down is waited for (below).
		b.mesh.C.ForwardFallback.Add(1)
		if c := b.logger.Check(zapcore.WarnLevel, "peer unreachable; serving here"); c != nil {
			c.Write(zap.String("host", rt.Host), zap.String("peer", d.Peer), zap.Error(err))
		}
	}
	if !rt.Hibernate {
		if rt.Upstream == "" {
			// A lives_at row the mesh did not forward: the mesh is off here, or the row
			// names this very box. Nothing here to dial.
			return p.Refuse(Refusal{Status: http.StatusServiceUnavailable,
				Err: fmt.Errorf("live route %s runs on another box (%s) and cannot be forwarded from this one", rt.Host, rt.LivesAt)})
		}
		return p.Live(rt.Upstream)
	}
	var use *engine.Use
	for wait := time.Duration(0); ; {
		var err error
		if use, err = b.Acquire(ctx, rt); err == nil {
			break
		}
		d, ok := b.AcquireFailed(err, rt, req.Hops)
		if ok {
			res, ferr := b.forward(p, rt.Host, d)
			if res == Answered {
				return ferr
			}
			if engine.CapRefused(err) {
				// The box with room takes no connections: the cap's refusal stands.
				ok = false
			} else {
				// The box holding the lease is live but takes no connections: it is shutting
				// down (and frees each lease as its drain puts the space to sleep), or
				// restarting, or dead (its lease frees with its heartbeat). Try again shortly.
				wait = leaseWait(ctx, wait)
			}
		}
		if !ok || wait == 0 {
			ref := RefusalOf(rt.Host, err, ctx.Err() != nil)
			if ref.Unexpected {
				if c := b.logger.Check(zapcore.ErrorLevel, "waking space"); c != nil {
					c.Write(zap.String("host", rt.Host), zap.Error(err))
				}
			}
			return p.Refuse(ref)
		}
	}
	// The request holds the space awake until its response, or the connection it
	// upgraded to, is finished.
	defer use.Release()
	return p.Instance(use)
}

// placeReopen is where a held stream's reopen goes (Request.Reopen), given placement's
// decision d: here while the space is awake here; from the client's box, to the peer
// that announced it awake, or where placement forwards it; Unavailable otherwise (the
// space is not awake where the reopen could go, and a reopen never wakes it).
func (b *Box) placeReopen(rt *registry.Route, req Request, d mesh.Decision) mesh.Decision {
	switch {
	case b.eng.Here(rt.Host):
		return mesh.Decision{Action: mesh.Serve}
	case req.Hops > 0:
	case req.AwakeAt != "" && req.AwakeAt != b.Self():
		return mesh.Decision{Action: mesh.Forward, Peer: req.AwakeAt}
	case d.Action == mesh.Forward:
		return d
	}
	return mesh.Decision{Action: mesh.Unavailable}
}

// forward sends the request to the peer d names. One that reached nothing forgets
// where host was known awake (mesh.Holders): whatever this box knew of it is stale.
func (b *Box) forward(p Proxy, host string, d mesh.Decision) (Forwarded, error) {
	res, err := p.Forward(d)
	if res == NotSent && b.mesh != nil && b.mesh.node != nil {
		b.mesh.node.Holders.Forget(host)
	}
	return res, err
}

// leaseWait sleeps before a request tries a space again whose lease holder could not be
// reached (mesh.NextLeaseWait), and returns the total waited so far; 0 means give up.
func leaseWait(ctx context.Context, waited time.Duration) time.Duration {
	step := mesh.NextLeaseWait(waited)
	if step == 0 {
		return 0
	}
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(step):
	}
	return waited + step
}

// Strip runs first on every request, on its header h: an invalid forwarded marker is
// removed, so outside traffic can neither spoof nor suppress forwarding; a valid one is
// removed too, so the instance never sees it, and its hop is returned (0: the request
// comes from a client), with whether the forward followed a holder entry
// (mesh.HintHeader, which counts only beside a valid marker). A scheduled-wake reason is
// removed: only the box itself sends scheduled wakes.
func (b *Box) Strip(h http.Header, host string) (hops int, viaHint bool) {
	h.Del("X-Lchat-Wake-Reason")
	ms := b.mesh
	if ms == nil {
		if len(h.Values(mesh.ForwardedHeader)) > 0 {
			h.Del(mesh.ForwardedHeader)
		}
		return 0, false
	}
	had := len(h.Values(mesh.ForwardedHeader)) > 0
	hint := h.Get(mesh.HintHeader) != ""
	h.Del(mesh.HintHeader)
	if hops = ms.marker.StripHops(h, host); hops > 0 {
		ms.C.ForwardedIn.Add(1)
	} else if had {
		ms.C.MarkersStripped.Add(1)
	}
	h.Del(mesh.ForwardedHeader)
	return hops, hops > 0 && hint
}

// Lookup is host's route.
func (b *Box) Lookup(host string) (*registry.Route, bool) { return b.reg.Lookup(host) }

// Acquire holds rt's space awake for one use, waking it if need be.
func (b *Box) Acquire(ctx context.Context, rt *registry.Route) (*engine.Use, error) {
	return b.eng.Acquire(ctx, SpaceOf(rt))
}

// Place decides where a request for rt goes (mesh.Node.Place), hops being the forwards
// it made before and viaHint whether the last one followed a holder entry. Without the
// mesh it is served here.
func (b *Box) Place(rt *registry.Route, hops int, viaHint bool) mesh.Decision {
	ms := b.mesh
	if ms == nil {
		return mesh.Decision{Action: mesh.Serve}
	}
	awake := rt.Hibernate && b.eng.Here(rt.Host)
	d := ms.node.Place(mesh.Request{Route: rt, Hops: hops, AwakeHere: awake, ViaHint: viaHint})
	if d.Action == mesh.Unavailable {
		ms.C.LivesAtLoops.Add(1)
	}
	return d
}

// AcquireFailed decides where a request goes whose space this box could not wake: its
// lease held by another live box (mesh.Node.LeaseHeld: forward to the holder), this box
// draining (mesh.Node.Draining: forward to the owner that takes the space over), or this
// box at its max_awake cap with every awake space in use (mesh.Node.AtCap: forward to the
// next box with room, nothing having been written). ok is false when no forward applies:
// the request gets the refusal of err (RefusalOf).
func (b *Box) AcquireFailed(err error, rt *registry.Route, hops int) (d mesh.Decision, ok bool) {
	ms := b.mesh
	if ms == nil {
		return mesh.Decision{}, false
	}
	var held *engine.LeaseHeldError
	switch {
	case errors.As(err, &held):
		d = ms.node.LeaseHeld(rt.Host, held.Holder, hops)
	case errors.Is(err, engine.ErrDraining):
		d = ms.node.Draining(rt.Host, rt.HomeRegion, hops)
	case engine.CapRefused(err):
		if d = ms.node.AtCap(rt.Host, rt.HomeRegion, hops); d.Action == mesh.Forward {
			if c := b.logger.Check(zapcore.InfoLevel, "awake cap reached; sending the wake to a box with room"); c != nil {
				c.Write(zap.String("host", rt.Host), zap.String("peer", d.Peer), zap.Int("hops", hops))
			}
			return d, true
		}
		return mesh.Decision{}, false
	default:
		return mesh.Decision{}, false
	}
	if d.Action != mesh.Forward {
		ms.C.LeaseBusy.Add(1)
		if c := b.logger.Check(zapcore.InfoLevel, "space unavailable: no forward left"); c != nil {
			c.Write(zap.String("host", rt.Host), zap.String("reason", d.Reason), zap.Int("hops", hops))
		}
		return mesh.Decision{}, false
	}
	ms.C.HolderForwards.Add(1)
	return d, true
}

// Refusal is the answer to a request that is not served: its host unknown (404), or its
// space unavailable now (503; never a 502, not being ready included).
type Refusal struct {
	// Status is 404, 503, or 499 when the client went away while it waited.
	Status int
	// RetryAfter is the engine's hint; 0: the handler's default.
	RetryAfter time.Duration
	// Err is what the client is told.
	Err error
	// Unexpected marks a failure that is none of the engine's refusals: worth a log line.
	Unexpected bool
}

// RefusalOf is the answer to a failed Acquire of host's space; clientGone says the request's
// context has ended.
func RefusalOf(host string, err error, clientGone bool) Refusal {
	var held *engine.LeaseHeldError
	var retry *engine.RetryError
	switch {
	case errors.As(err, &held):
		// Single box, or no forward left: nothing to forward to.
		return Refusal{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("space %s is held by another box", host)}
	case errors.As(err, &retry):
		return Refusal{Status: http.StatusServiceUnavailable, RetryAfter: retry.After, Err: fmt.Errorf("space %s unavailable: %s", host, retry.Reason)}
	case errors.Is(err, engine.ErrUnknownKind):
		// The route names a kind this box's config no longer has (a reload removed it):
		// an operator's fix away, so a client may retry.
		return Refusal{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("space %s: its kind is not configured on this box", host)}
	case clientGone && errors.Is(err, context.Canceled):
		// Caddy's proxy reports a client gone while waiting as 499 too.
		return Refusal{Status: 499, Err: err}
	}
	return Refusal{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("waking space %s failed", host), Unexpected: true}
}

// NoAnswer reports whether a reverse proxy's error status means the upstream (an instance,
// or a peer) gave no answer to the request: 502 or 504, which the proxy returns only
// before it writes a response. Such a request is answered 503 with Retry-After: the space
// is unavailable for a moment (its instance crashed, was stopped or fenced; its peer died
// or was cut off), never a bad gateway. A write sent that way may or may not have been
// applied, as with any lost answer.
func NoAnswer(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusGatewayTimeout
}

// RetrySafe reports whether a request whose forward failed with err reached nothing that
// could have acted on it, so that sending it again, or serving it here, is safe: the peer
// could not be dialed at all (dialFailed: nothing was sent, TLS handshake included), or a
// bodiless GET or HEAD met a peer closing its connections as it shuts down, before any
// answer.
func RetrySafe(dialFailed bool, method string, contentLength int64, err error) bool {
	if dialFailed {
		return true
	}
	if method != http.MethodGet && method != http.MethodHead || contentLength > 0 {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}
