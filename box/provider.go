package box

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/registry"
)

// The provider seam on the box (package provider holds its rules): a route delegated to
// a provider is forwarded there by whichever box receives it; a route hosted for another
// fleet is served only to that fleet; a space moving between the two is served by
// neither side meanwhile.

// ProviderProxy is a Proxy that can carry a request to a provider. A Proxy that cannot
// (a held connection's event door) gets a 503 for a delegated space.
type ProviderProxy interface {
	// Provider forwards the request to the named provider; it returns when the answer,
	// or the connection it upgraded to, is finished.
	Provider(name string) error
}

// MovingRetryAfter is the Retry-After of a space moving between this fleet and its
// provider: a move takes a sleep and a copy of its state.
const MovingRetryAfter = 5 * time.Second

// serveProvided decides a request for a route with a delegation: done false lets Serve
// go on (a hosted space asked for by its own fleet).
func (b *Box) serveProvided(rt *registry.Route, req Request, p Proxy) (err error, done bool) {
	switch {
	case rt.ProviderState != "":
		return p.Refuse(Refusal{Status: http.StatusServiceUnavailable, RetryAfter: MovingRetryAfter,
			Err: fmt.Errorf("space %s is moving between this fleet and its provider", rt.Host)}), true
	case rt.Provider != "":
		pp, ok := p.(ProviderProxy)
		if !ok {
			return p.Refuse(Refusal{Status: http.StatusServiceUnavailable,
				Err: fmt.Errorf("space %s is served by its provider, which this door cannot reach", rt.Host)}), true
		}
		return pp.Provider(rt.Provider), true
	case req.Client == rt.HostedFor, req.Client == "" && req.Hops > 0:
		// Its fleet's request, or one a box of this fleet forwarded (the entry box
		// checked its marker).
		return nil, false
	}
	// Anyone else learns nothing of it: the answer of an unknown host.
	return p.Refuse(Refusal{Status: http.StatusNotFound, Err: fmt.Errorf("no route for host %q", req.Host)}), true
}

// Delegation is where a route stands with a provider (registry.Route's fields).
type Delegation struct {
	// Provider delegates the space (empty: the fleet runs it).
	Provider string
	// State is registry.ProviderDelegating or ProviderReclaiming while it moves, or
	// while a hosted space is held for its take-back; empty otherwise.
	State string
}

// SetDelegation stores host's delegation d, settles its space (delegated or moving: put
// to sleep here, its lease released) and fans the row out, so every box of the fleet
// forwards, refuses or serves it alike. A failed sleep is the caller's error; the row is
// stored and fanned out either way.
func (b *Box) SetDelegation(ctx context.Context, host string, d Delegation) (registry.Route, error) {
	stored, err := b.reg.Update(host, func(rt *registry.Route) error {
		rt.Provider, rt.ProviderState = d.Provider, d.State
		return nil
	})
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return registry.Route{}, fail(http.StatusNotFound, "no route for host %s", host)
	case err != nil:
		return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
	}
	err = b.settle(ctx, host, false)
	b.fanout(stored)
	b.logger.Info("route delegation changed", zap.String("host", host), zap.String("provider", d.Provider), zap.String("state", d.State))
	if err != nil {
		return stored, fail(http.StatusInternalServerError, "route %s updated, but putting its space to sleep failed: %v", host, err)
	}
	return stored, nil
}

// CreateHosted stores, as Create does, a new route hosted for the fleet client (a
// provider's API): hosted from its first revision, so it is never served to anyone else,
// and held (registry.ProviderReclaiming) until its fleet resumes it (SetDelegation with
// no state), once the fleet's route names this provider: until then no box serves or
// wakes it, so a delegation undone before that leaves nothing here that runs.
func (b *Box) CreateHosted(ctx context.Context, spec registry.Spec, client string) (registry.Route, error) {
	rt, err := registry.NewRoute(spec, b.settings.Load().CloudRegion)
	if err != nil {
		return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
	}
	rt.HostedFor, rt.ProviderState = client, registry.ProviderReclaiming
	if err := b.checkRoute(&rt); err != nil {
		return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
	}
	stored, err := b.reg.Create(rt)
	if errors.Is(err, registry.ErrExists) {
		return registry.Route{}, fail(http.StatusConflict, "route %s exists", rt.Host)
	}
	if err != nil {
		return registry.Route{}, err
	}
	b.logger.Info("route created for a client fleet", zap.String("host", stored.Host), zap.String("hosted_for", client),
		zap.String("kind", stored.Kind), zap.Strings("env_names", stored.Summary().EnvNames))
	b.fanout(stored)
	return stored, nil
}

// Delegated counts the routes delegated to provider.
func (b *Box) Delegated(provider string) int {
	return b.countRoutes(func(rt *registry.Route) bool { return rt.Provider == provider })
}

// Hosted counts the routes hosted for client.
func (b *Box) Hosted(client string) int {
	return b.countRoutes(func(rt *registry.Route) bool { return rt.HostedFor == client })
}

func (b *Box) countRoutes(match func(*registry.Route) bool) int {
	n := 0
	for after := ""; ; {
		page, next, err := b.reg.List(after, registry.MaxPageLimit)
		if err != nil {
			return n
		}
		for i := range page {
			if match(&page[i]) {
				n++
			}
		}
		if next == "" {
			return n
		}
		after = next
	}
}
