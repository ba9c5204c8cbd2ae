package box

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// What a route change does, whichever door it came through. A change is stored in the
// registry first, so that what the box then does with the space follows the row the
// registry holds (settle); a change made here is fanned out to the peers whatever became
// of the space. The caller waits until the space is settled and learns of a failure: the
// admin API and the console say it to the operator, the peer API answers it with an
// error status that the sending box logs and retries. A caller that goes away does not
// abort the settling: a save once begun is carried to its end.

// saveTimeout bounds saving and stopping a space that a change takes off this box.
const saveTimeout = time.Minute

// settle makes this box's engine agree with the registry's row for host, after a change
// was stored, or found already stored (a peer's retry, a duplicate): with no row the
// space is saved and its local state dropped (discard: dropped without saving); a row
// that does not hibernate (a live route, or one pinned to another box) must not run here,
// so its space is checkpointed and put to sleep; a hibernating row changes nothing. It is
// one rule for every door, so that a change arriving from a peer does what the same
// change made here does.
func (b *Box) settle(ctx context.Context, host string, discard bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), saveTimeout)
	defer cancel()
	rt, ok := b.reg.Lookup(host)
	switch {
	case !ok && discard:
		return b.eng.Discard(ctx, host)
	case !ok:
		return b.eng.Remove(ctx, host)
	case !rt.Hibernate, rt.Delegated():
		// Not this box's to run: live elsewhere, delegated to a provider, or moving
		// between this fleet and a provider (box/provider.go).
		return b.eng.Sleep(ctx, host)
	}
	return nil
}

// Create stores a new route (registry.NewRoute applies the create defaults, the box's
// CloudRegion among them) and fans it out. With spec.Mint the host is minted from the
// next id (mint). The route must be one this box's kinds can serve.
func (b *Box) Create(ctx context.Context, spec registry.Spec) (registry.Route, error) {
	s := b.settings.Load()
	rt, err := registry.NewRoute(spec, s.CloudRegion)
	if err != nil {
		return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
	}
	var stored registry.Route
	if spec.Mint {
		if stored, err = b.mint(ctx, s, rt); err != nil {
			return registry.Route{}, err
		}
	} else {
		if err := b.checkRoute(&rt); err != nil {
			return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
		}
		stored, err = b.reg.Create(rt)
		if errors.Is(err, registry.ErrExists) {
			return registry.Route{}, fail(http.StatusConflict, "route %s exists; remove it first", rt.Host)
		}
		if err != nil {
			return registry.Route{}, err
		}
	}
	b.logger.Info("route created", zap.String("host", stored.Host), zap.Bool("minted", spec.Mint), zap.String("kind", stored.Kind),
		zap.Bool("hibernate", stored.Hibernate), zap.Strings("env_names", stored.Summary().EnvNames))
	b.fanout(stored)
	return stored, nil
}

// Remove deletes host's route, settles its space (saved first, then its local state
// dropped; discard: dropped without saving; its bucket data stays) and tombstones the row
// on the peers. The row goes first, so that no new request wakes the space. A failed save
// keeps the local state and is the caller's error; the route is gone whatever the space's
// state, so the tombstone goes out either way. A route delegated to a provider (or moving
// between this fleet and it) is refused (409), changing nothing: the provider holds the
// space's only current state and its scheduled wakes, and only a reclaim brings them back.
func (b *Box) Remove(ctx context.Context, host string, discard bool) error {
	rt, err := b.reg.Get(host)
	if err == nil && rt.Provider != "" {
		return fail(http.StatusConflict, "route %s is delegated to %s: reclaim it first (lchat-caddy reclaim %s); nothing was changed", host, rt.Provider, host)
	}
	if err == nil {
		err = b.reg.Delete(host)
	}
	if errors.Is(err, registry.ErrNotFound) {
		return fail(http.StatusNotFound, "no route for host %s", host)
	}
	if err != nil {
		return err
	}
	err = b.settle(ctx, host, discard)
	b.fanoutTombstone(host, rt.HomeRegion)
	if err != nil {
		return fail(http.StatusInternalServerError, "route %s removed, but saving and stopping its space failed: %v", host, err)
	}
	b.logger.Info("route removed", zap.String("host", host), zap.Bool("discard", discard))
	return nil
}

// SetHibernate turns hibernation of host's route on or off (registry.SetHibernate),
// settles its space (turned off: checkpointed and put to sleep, no longer this box's to
// run) and fans the row out. A failed sleep is the caller's error; the row is stored and
// fanned out either way.
func (b *Box) SetHibernate(ctx context.Context, host string, on bool, upstream string) (registry.Route, error) {
	cur, err := b.reg.Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return registry.Route{}, fail(http.StatusNotFound, "no route for host %s", host)
	}
	if err != nil {
		return registry.Route{}, err
	}
	next := registry.SetHibernate(cur, on, upstream)
	if err := b.checkRoute(&next); err != nil {
		return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
	}
	stored, err := b.reg.Update(host, func(rt *registry.Route) error {
		rt.Hibernate, rt.Upstream, rt.LivesAt = next.Hibernate, next.Upstream, next.LivesAt
		return nil
	})
	if err != nil {
		return registry.Route{}, err
	}
	err = b.settle(ctx, host, false)
	b.fanout(stored)
	if err != nil {
		return stored, fail(http.StatusInternalServerError, "route %s updated, but putting its space to sleep failed: %v", host, err)
	}
	return stored, nil
}

// Applied is what a peer's row or tombstone did on this box.
type Applied struct {
	// Route is the row stored (ApplyRow, not Kept or Stale).
	Route registry.Route
	// Kept: the row names this box as where its live space lives; the row here is the
	// original and stays (mesh.ErrKept).
	Kept bool
	// Stale: older than the row or tombstone held here; the registry is unchanged.
	Stale bool
	// Existed: a tombstone deleted a row.
	Existed bool
}

// ErrMeshOff refuses a mesh operation on a box without LCHAT_MESH_SELF: the peer API is
// not there (404); an operator's mesh action conflicts with the box's config (409).
var ErrMeshOff = errors.New("the mesh is off on this box (LCHAT_MESH_SELF is not set)")

// ApplyRow stores a row a peer replicated, if this box accepts it (mesh.Node.AcceptRow)
// and it is newer than what is held (registry.ApplyReplicated), then settles the space
// as a change made here would: a row pinned to another box sleeps the copy awake here,
// synchronously, so the peer's answer says whether it is saved. A stale row settles
// too: a retry of a row whose settling failed carries it out.
func (b *Box) ApplyRow(ctx context.Context, row mesh.RouteRow) (Applied, error) {
	ms := b.mesh
	if ms == nil {
		return Applied{}, &Error{Status: http.StatusNotFound, Err: ErrMeshOff}
	}
	prev, _ := b.reg.Lookup(row.Host)
	rt, err := ms.node.AcceptRow(row, prev, b.checkRoute)
	if errors.Is(err, mesh.ErrKept) {
		return Applied{Kept: true}, nil
	}
	if err != nil {
		ms.C.RowsRejected.Add(1)
		return Applied{}, refusal(err)
	}
	// A row with a revision is stored only if it is newer than the row or tombstone
	// held here (registry/version.go); one without comes from a box that predates
	// revisions and is stored as before, with no revision (any versioned change wins).
	stored, err := b.reg.ApplyReplicated(rt)
	stale := errors.Is(err, registry.ErrStale)
	if err != nil && !stale {
		return Applied{}, err
	}
	if stale {
		ms.C.RowsStale.Add(1)
	} else {
		ms.C.RowsIn.Add(1)
		b.logger.Info("route replicated from a peer", zap.String("host", stored.Host), zap.String("kind", stored.Kind),
			zap.Bool("hibernate", stored.Hibernate), zap.String("home_region", stored.HomeRegion),
			zap.String("lives_at", stored.LivesAt), zap.Strings("env_names", stored.Summary().EnvNames))
	}
	if err := b.settle(ctx, row.Host, false); err != nil {
		return Applied{}, fail(http.StatusInternalServerError, "route %s replicated, but putting its space to sleep failed: %v", row.Host, err)
	}
	return Applied{Route: stored, Stale: stale}, nil
}

// ApplyTombstone deletes host's row on a peer's word, if this box accepts it
// (mesh.Node.AcceptTombstone) and its revision rev is at least the row's
// (registry.RemoveReplicated; empty: from a box without revisions), then settles the
// space as a local removal does: saved, then its local state dropped. A failed save is an
// error (500), as it is for a local removal, so the sending box logs it and retries; the
// retry, stale by then, settles again.
func (b *Box) ApplyTombstone(ctx context.Context, host, rev string) (Applied, error) {
	ms := b.mesh
	if ms == nil {
		return Applied{}, &Error{Status: http.StatusNotFound, Err: ErrMeshOff}
	}
	prev, _ := b.reg.Lookup(host)
	if err := ms.node.AcceptTombstone(host, prev); err != nil {
		ms.C.RowsRejected.Add(1)
		return Applied{}, refusal(err)
	}
	existed, err := b.reg.RemoveReplicated(host, rev)
	stale := errors.Is(err, registry.ErrStale)
	switch {
	case errors.Is(err, registry.ErrInvalidRev):
		ms.C.RowsRejected.Add(1)
		return Applied{}, fail(http.StatusBadRequest, "%w", err)
	case stale:
		// The row here is newer than this tombstone (a re-create: it stays), or the
		// tombstone was applied before.
		ms.C.RowsStale.Add(1)
	case err != nil:
		return Applied{}, err
	default:
		ms.C.TombstonesIn.Add(1)
		if existed {
			b.logger.Info("route tombstoned by a peer", zap.String("host", host))
		}
	}
	if err := b.settle(ctx, host, false); err != nil {
		return Applied{}, fail(http.StatusInternalServerError, "route %s tombstoned, but saving and stopping its space failed: %v", host, err)
	}
	return Applied{Stale: stale, Existed: existed}, nil
}

// refusal is the Error of a refused row or tombstone: 409 for one that conflicts with
// this box's state or view, else 400.
func refusal(err error) error {
	var re *mesh.RefusedError
	if errors.As(err, &re) && re.Conflict {
		return &Error{Status: http.StatusConflict, Err: err}
	}
	return &Error{Status: http.StatusBadRequest, Err: err}
}

// SleepNow puts host's space to sleep on this box now (stop, checkpoint, release its
// lease): the console's "hibernate now". The space must be awake here.
func (b *Box) SleepNow(ctx context.Context, host string) error {
	if _, err := b.reg.Get(host); errors.Is(err, registry.ErrNotFound) {
		return fail(http.StatusNotFound, "no route for host %s", host)
	}
	if !slices.Contains(b.awake(), host) {
		return fail(http.StatusConflict, "%s is not awake on this box", host)
	}
	return b.eng.Sleep(ctx, host)
}
