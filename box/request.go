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

// The request path's rules, each in one place: the handler (modules/lchat) asks them and
// carries the answer out with Caddy's reverse proxy.

// Lookup is host's route.
func (b *Box) Lookup(host string) (*registry.Route, bool) { return b.reg.Lookup(host) }

// Acquire holds rt's space awake for one request, waking it if need be.
func (b *Box) Acquire(ctx context.Context, rt *registry.Route) (*engine.Use, error) {
	return b.eng.Acquire(ctx, SpaceOf(rt))
}

// Place decides where a request for rt goes (mesh.Box.Place), hops being the forwards
// it made before and viaHint whether the last one followed a holder entry. Without the
// mesh it is served here.
func (b *Box) Place(rt *registry.Route, hops int, viaHint bool) mesh.Decision {
	ms := b.mesh
	if ms == nil {
		return mesh.Decision{Action: mesh.Serve}
	}
	awake := rt.Hibernate && b.eng.Awake(rt.Host)
	d := ms.box.Place(mesh.Request{Route: rt, Hops: hops, AwakeHere: awake, ViaHint: viaHint})
	if d.Action == mesh.Unavailable {
		ms.C.LivesAtLoops.Add(1)
	}
	return d
}

// AcquireFailed decides where a request goes whose space this box could not wake: its
// lease held by another live box (mesh.Box.LeaseHeld: forward to the holder), or this box
// draining (mesh.Box.Draining: forward to the owner that takes the space over). ok is
// false when no forward applies: the request gets the refusal of err (Refuse).
func (b *Box) AcquireFailed(err error, rt *registry.Route, hops int) (d mesh.Decision, ok bool) {
	ms := b.mesh
	if ms == nil {
		return mesh.Decision{}, false
	}
	var held *engine.LeaseHeldError
	switch {
	case errors.As(err, &held):
		d = ms.box.LeaseHeld(rt.Host, held.Holder, hops)
	case errors.Is(err, engine.ErrDraining):
		d = ms.box.Draining(rt.Host, rt.HomeRegion, hops)
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

// Refusal is the answer to a request whose space cannot be served now. Not being ready
// is never a 502.
type Refusal struct {
	// Status is 503, or 499 when the client went away while it waited.
	Status int
	// RetryAfter is the engine's hint; 0: the handler's default.
	RetryAfter time.Duration
	// Err is what the client is told.
	Err error
	// Unexpected marks a failure that is none of the engine's refusals: worth a log line.
	Unexpected bool
}

// Refuse is the answer to a failed Acquire of host's space; clientGone says the request's
// context has ended.
func Refuse(host string, err error, clientGone bool) Refusal {
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
