package box

import (
	"context"
	"errors"
	"net/http"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// History lists host's checkpoints within its kind's retention, oldest first, each with
// the log that extends it; never nil. A host without a route is a 404, as for Restore.
func (b *Box) History(ctx context.Context, host string) ([]spacestore.Checkpoint, error) {
	if _, err := b.reg.Get(host); errors.Is(err, registry.ErrNotFound) {
		return nil, fail(http.StatusNotFound, "no route for host %s", host)
	} else if err != nil {
		return nil, err
	}
	cps, err := b.eng.History(ctx, host)
	if err != nil {
		return nil, err
	}
	if cps == nil {
		cps = []spacestore.Checkpoint{}
	}
	return cps, nil
}

// Restore makes the checkpoint t names the current state of host's asleep space, as a
// new generation. It is refused (409), writing nothing, while the space is awake on any
// box.
func (b *Box) Restore(ctx context.Context, host string, t spacestore.Target) (spacestore.RestoreResult, error) {
	rt, err := b.reg.Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return spacestore.RestoreResult{}, fail(http.StatusNotFound, "no route for host %s", host)
	}
	if err != nil {
		return spacestore.RestoreResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, saveTimeout)
	defer cancel()
	res, err := b.eng.RestoreTo(ctx, host, rt.Kind, t)
	var held *engine.LeaseHeldError
	switch {
	case errors.Is(err, engine.ErrAwake):
		return res, fail(http.StatusConflict, "%s is awake on this box: put it to sleep first (lchat-caddy sleep %s), then restore", host, host)
	case errors.As(err, &held):
		return res, fail(http.StatusConflict, "%s is awake on %s: put it to sleep there first (lchat-caddy sleep %s --address <its admin API>), then restore",
			host, held.Holder, host)
	case errors.Is(err, spacestore.ErrNoCheckpoint):
		return res, fail(http.StatusNotFound, "%v", err)
	}
	return res, err
}
