package engine

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/spacestore"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// SetFenced moves the box's lifecycle into or out of its fence (lifecycle.Machine.Fence),
// as the mesh heartbeat does; the engine acts on the move (fenceMoved).
func (e *Engine) SetFenced(fenced bool) { e.life.Fence(fenced) }

// fenceMoved is the engine's part of a fence move of the box's lifecycle (its OnFence).
// Fenced: stop serving and writing (instances are stopped; nothing is written; local
// state is kept). Unfenced: every held space's lease and manifest are re-read; if still
// this box's, its local state is checkpointed and the lease released; otherwise the local
// state is dropped. Only then are the spaces served again.
func (e *Engine) fenceMoved(fenced bool) {
	reason := "unfenced"
	if fenced {
		reason = "fenced: heartbeat writes failing"
	}
	e.emit(Event{Type: EventFence, Reason: reason})
	if fenced {
		e.log.Warn("fenced: heartbeat writes failing; stopping every awake space without writing")
		for _, in := range e.all() {
			safego.Go(&e.wg, e.log, "fence stop", func() { e.fenceStop(in) })
		}
		return
	}
	e.log.Info("unfenced: re-reading leases of held spaces")
	for _, in := range e.all() {
		in.mu.Lock()
		start := in.state == StateHeld && in.setStateLocked(StateRechecking) == nil
		in.mu.Unlock()
		if start {
			safego.Go(&e.wg, e.log, "unfence", func() { e.recheck(in) })
		}
	}
}

// recheck resolves a held space (StateRechecking, set by whoever started the recheck):
// still this box's lease and manifest, its local state is checkpointed and the lease
// released; else the local state is dropped. It goes back to StateHeld when that cannot be
// decided or saved now.
func (e *Engine) recheck(in *inst) {
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	state, etag, fenced := in.state, in.leaseETag, e.life.Fenced()
	if state == StateRechecking && fenced {
		in.setStateLocked(StateHeld) // fenced again: the next unfence rechecks
	}
	in.mu.Unlock()
	if state != StateRechecking || fenced {
		return
	}
	back := func() {
		in.mu.Lock()
		in.setStateLocked(StateHeld)
		in.mu.Unlock()
	}
	log := in.logger()
	ctx := e.ctx
	ours, err := spacestore.StillHeld(ctx, e.cfg.Bucket, in.host, etag, e.holder)
	if err == nil && ours && in.syncer != nil {
		if in.syncer.Unsure() {
			// A checkpoint the fence cut off (its sync cancelled) may have landed its
			// manifest with the answer lost: with the lease still ours, that manifest is
			// this box's own, and the data dir holds what it covers and every write after.
			// Settle adopts it, or finds the manifest this box last knew; another
			// writer's manifest is ErrFenced.
			if _, err = in.syncer.Settle(ctx); errors.Is(err, spacestore.ErrFenced) {
				ours, err = false, nil
			}
		} else {
			_, cur, rerr := spacestore.ReadManifest(ctx, e.cfg.Bucket, in.host)
			_, mine := in.syncer.Manifest()
			err = rerr
			ours = cur == mine
		}
	}
	if err != nil {
		log.Warn("re-reading lease after fence; will retry on next unfence", zap.Error(err))
		back()
		return
	}
	next := StateAsleep
	if ours {
		next, err = e.checkpointAndRelease(ctx, in)
	} else {
		e.c.fenced.Add(1)
		log.Warn("lease or manifest taken over while fenced; dropping local state")
	}
	if err != nil && next != StateFenced {
		log.Warn("checkpoint after fence failed; still held", zap.Error(err))
		back()
		return
	}
	in.mu.Lock()
	if !ours {
		in.leaseETag = ""
	}
	in.setStateLocked(next)
	in.mu.Unlock()
}

// flushDirty retries the checkpoint of a space that went to sleep with a failed checkpoint.
func (e *Engine) flushDirty(ctx context.Context, in *inst) error {
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	unsaved := in.state == StateUnsaved
	in.mu.Unlock()
	if !unsaved || e.life.Fenced() {
		return nil
	}
	next, err := e.checkpointAndRelease(ctx, in)
	in.mu.Lock()
	if next != StateUnsaved {
		in.setStateLocked(next)
	}
	in.mu.Unlock()
	return err
}
