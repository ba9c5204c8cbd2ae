package engine

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/spacestore"
)

// A wake writes its lease while it restores the data dir and starts the instance, the way
// the fence is written while the instance starts: on a file bucket each is an fsynced
// write of 1-3 ms, as long as the rest of the engine's part of a wake. What makes that
// safe is what the wake does before the lease is known to be held:
//
//   - it reads (the manifest, the objects) and writes only this box's own copy of the
//     space's data dir, which for a wake from asleep, failed or fenced holds nothing the
//     bucket lacks. A wake from unsaved (the data dir holds what the bucket lacks) takes
//     its lease first, as does every wake with Config.LeaseBeforeStart;
//   - the instance may start, but nothing is proxied to it before the wake ends, and the
//     wake ends only after the lease and then the fence are written (the fence carries the
//     lease's ETag, so it cannot go first; it is written the moment the lease is held,
//     beside the start, fenceAsync);
//   - a refused lease ends the instance and waits for it to exit before the wake returns.
//     Whatever it changed in the data dir is not kept: the restore took the reuse record
//     before it started (reuse.go), so the next wake restores in full;
//   - room under max_awake is taken before the lease only where it needs no eviction: a
//     refused lease never puts another space to sleep (capacity.go).
//
// An app that acts outside its data dir as it starts (sends mail, calls a webhook) may so
// act twice when two boxes race for one space (as it already could beside a lost fence);
// Config.LeaseBeforeStart restores the old order for a whole box (no directive sets it yet).

// pendingLease is a wake's lease write, in flight beside its restore and start. Its
// fields are written by the lease goroutine before done closes; checked, etag and err
// after that by the wake's goroutine only.
type pendingLease struct {
	done    chan struct{}
	etag    string
	err     error
	checked bool  // result has run: the mapped error below is final
	werr    error // the wake's error for the lease: a *LeaseHeldError or a *RetryError
}

// acquireLeaseAsync starts writing in's lease (spacestore.AcquireLeaseAfter: one write
// when this box released it last).
func (e *Engine) acquireLeaseAsync(in *inst) *pendingLease {
	pl := &pendingLease{done: make(chan struct{}), err: errors.New("lease write did not finish")}
	now := e.now()
	in.mu.Lock()
	released := in.releasedETag
	in.releasedETag = "" // one try: whatever happens now, it is no longer the lease
	h := e.holder
	if gone := in.goneHolder; gone[0] != "" && h.Live != nil {
		live := h.Live
		h.Live = func(holder, incarnation string) bool {
			return (holder != gone[0] || incarnation != gone[1]) && live(holder, incarnation)
		}
	}
	in.goneHolder = [2]string{}
	in.mu.Unlock()
	safego.Go(&e.wg, e.log, "lease", func() {
		defer close(pl.done)
		pl.etag, pl.err = spacestore.AcquireLeaseAfter(e.ctx, e.cfg.Bucket, in.host, h, now, released)
	})
	return pl
}

// result waits for the lease write and returns the wake's error for it (nil: the lease is
// held and in.leaseETag is its ETag). onWait runs once, when the wait ends, for the
// wake's phases. It runs on the wake's goroutine; later calls return the same answer.
func (e *Engine) leaseResult(in *inst, pl *pendingLease, onWait func()) error {
	if pl.checked {
		return pl.werr
	}
	<-pl.done
	pl.checked = true
	onWait()
	var held *spacestore.LeaseHeldError
	switch {
	case errors.As(pl.err, &held):
		e.c.leaseConflicts.Add(1)
		pl.werr = &LeaseHeldError{Holder: held.Holder}
	case pl.err != nil:
		in.logger().Error("acquiring lease", zap.Error(pl.err))
		pl.werr = &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
	default:
		in.mu.Lock()
		in.leaseETag = pl.etag
		in.mu.Unlock()
	}
	return pl.werr
}

// fenceAsync writes the fence (spacestore.Syncer.Fence, stamped with the lease) once pl
// is held, and sends its error; a refused lease writes nothing (errNoLease). The caller
// leaves the syncer to it until the answer arrives.
func (e *Engine) fenceAsync(ctx context.Context, in *inst, pl *pendingLease) <-chan error {
	ch := make(chan error, 1)
	safego.Go(&e.wg, e.log, "fence", func() {
		res := errors.New("fence write did not finish")
		defer func() { ch <- res }()
		<-pl.done
		if pl.err != nil {
			res = errNoLease
			return
		}
		res = in.syncer.Fence(ctx, spacestore.Claim{Holder: e.holder.ID, Incarnation: e.holder.Incarnation, Lease: pl.etag, At: e.now()})
	})
	return ch
}

// errNoLease is a fence not written because the lease was refused.
var errNoLease = errors.New("lease not held: fence not written")
