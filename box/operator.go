package box

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// SpaceReport is one route as the operator's `status` shows it: the route and this
// box's state of its space, where in the fleet it is awake and its connections are held
// (fleetview.Join), and its last checkpoint in the bucket (nil: never checkpointed, or a
// live route).
type SpaceReport struct {
	fleetview.Space
	Stored *fleetview.Stored `json:"stored,omitempty"`
}

// storedReads bounds the manifest reads of one SpaceReports at once.
const storedReads = 16

// SpaceReports reads every route (host "") or host's alone, as the console's list does
// (Console.Spaces, the fleet, fleetview.Join), and with stored each hibernating space's
// manifest (one bucket read per space, storedReads at once). An unknown host is a 404
// error.
func (b *Box) SpaceReports(ctx context.Context, host string, stored bool) ([]SpaceReport, error) {
	var spaces []fleetview.Space
	if host != "" {
		if _, err := b.reg.Get(host); errors.Is(err, registry.ErrNotFound) {
			return nil, fail(http.StatusNotFound, "no route for host %s", host)
		} else if err != nil {
			return nil, err
		}
		all, err := b.Console().Spaces(ctx, host, 0)
		if err != nil {
			return nil, err
		}
		for _, sp := range all {
			if sp.Host == host {
				spaces = append(spaces, sp)
			}
		}
	} else {
		var err error
		if spaces, err = b.Console().Spaces(ctx, "", 0); err != nil {
			return nil, err
		}
	}
	fleetview.Join(spaces, b.Fleet(ctx))
	out := make([]SpaceReport, len(spaces))
	sem := make(chan struct{}, storedReads)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		readErr error
	)
	for i := range spaces {
		out[i].Space = spaces[i]
		if !stored || !spaces[i].Hibernate {
			continue
		}
		sem <- struct{}{}
		safego.Go(&wg, b.logger, "space report manifest read", func() {
			defer func() { <-sem }()
			st, ok, err := b.Console().Stored(ctx, out[i].Host)
			if err != nil {
				mu.Lock()
				readErr = errors.Join(readErr, err)
				mu.Unlock()
				return
			}
			if ok {
				out[i].Stored = &st
			}
		})
	}
	wg.Wait()
	if readErr != nil {
		return out, fail(http.StatusBadGateway, "reading manifests from the bucket: %v", readErr)
	}
	return out, nil
}

// WakeNow wakes host's space on this box if it is not awake here: what its first
// request would do when placement serves it here (Place, Acquire), without a request.
// It then stays awake until its idle timeout. A space placement sends to another box is
// refused (409) with that box named: wake it there, or send it a request. A live route
// has nothing to wake (409).
func (b *Box) WakeNow(ctx context.Context, host string) error {
	rt, ok := b.reg.Lookup(host)
	if !ok {
		return fail(http.StatusNotFound, "no route for host %s", host)
	}
	if !rt.Hibernate {
		return fail(http.StatusConflict, "%s is a live route: it has no space to wake", host)
	}
	if rt.Delegated() && rt.Provider == "" {
		return fail(http.StatusConflict, "%s is held asleep for the fleet %s, which has not resumed it here (a move in progress): it is not woken until then", host, rt.HostedFor)
	}
	if rt.Delegated() {
		return fail(http.StatusConflict, "%s is served by its provider %s, not by this fleet", host, rt.Provider)
	}
	if d := b.Place(rt, 0, false); d.Action == mesh.Forward {
		return fail(http.StatusConflict, "%s runs on %s, not on this box: wake it there (or send it a request)", host, d.Peer)
	} else if d.Action == mesh.Unavailable {
		return fail(http.StatusServiceUnavailable, "%s cannot be woken now: %s", host, d.Reason)
	}
	use, err := b.Acquire(ctx, rt)
	if err != nil {
		if d, ok := b.AcquireFailed(err, rt, 0); ok {
			return fail(http.StatusConflict, "%s is awake on %s: its lease is held there", host, d.Peer)
		}
		ref := RefusalOf(rt.Host, err, ctx.Err() != nil)
		return fail(ref.Status, "waking %s: %v", host, ref.Err)
	}
	use.Release()
	return nil
}
