package engine

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/spacestore"
)

// runWake performs one wake and publishes its result to the waiters.
func (e *Engine) runWake(in *inst, t *transition) {
	defer e.gate.end(t.ticket) // a wake that failed before its start holds no slot back
	in.op.Lock()
	in.mu.Lock()
	dropped := in.state == StateDropped // a Discard took op before this wake did
	in.mu.Unlock()
	if dropped {
		// The drop's move out of waking ended this wake for its waiters, who look the
		// host up again.
		in.op.Unlock()
		return
	}
	unsaved, err := e.wake(in, t.from, t.ticket)
	in.mu.Lock()
	in.noteWakeResultLocked(err)
	switch {
	case in.state != StateWaking: // nothing else moves a waking space while its wake holds op
	case err != nil:
		t.err = err
		next := StateAsleep
		var re *RetryError
		switch {
		case unsaved:
			next = StateUnsaved // the data dir still holds what the bucket lacks
		case errors.As(err, &re) && !errors.Is(err, errAwakeCap):
			next = StateFailed
		}
		in.setStateLocked(next)
	default:
		in.setStateLocked(StateAwake)
		in.gen++
		in.uses = 0
		in.lastUsed = e.now()
		in.armIdleLocked()
	}
	in.mu.Unlock()
	in.op.Unlock()
}

// wake runs with in.op held: make room; lease, beside restore and start; fence; await
// readiness.
// from is the state the wake started from. unsaved reports, for a failed wake from
// StateUnsaved, that the data dir still holds state the bucket lacks (nothing was restored
// over it): the lease is kept then, as it was before the wake. ticket orders the start
// among concurrent wakes (startGate).
func (e *Engine) wake(in *inst, from State, ticket uint64) (unsaved bool, err error) {
	ctx := e.ctx
	log := in.logger()
	began := e.now()
	in.mu.Lock()
	sp, kind := in.sp, in.kind
	in.mu.Unlock()

	// A wake the awake cap would refuse costs nothing; room is made (another space put
	// to sleep) only once the lease is ours and the state restored, right before the
	// start, so a wake that fails on the bucket never evicts anyone.
	if err := e.checkRoom(in); err != nil {
		return from == StateUnsaved, err
	}
	unsaved = from == StateUnsaved

	// Observers hear each phase's duration, for "why was that wake slow". The phases
	// partition the wake's time: one that overlaps an earlier one (the lease beside the
	// restore and start, the fence beside the start) counts what remained of it.
	var ph WakePhases
	mark := e.now()
	phase := func(d *time.Duration) {
		now := e.now()
		*d, mark = *d+now.Sub(mark), now
	}
	defer func() {
		ev := Event{Type: EventWake, Host: in.host, Phases: ph, Order: ticket}
		in.mu.Lock()
		ev.Size = in.size
		in.mu.Unlock()
		if err != nil {
			ev.Err = err.Error()
		}
		e.emit(ev)
	}()

	// The lease is written while the data dir is restored and the instance started
	// (wakelease.go says why that is safe); the fence waits for it, and so does every
	// return. A wake from unsaved, or on a box with LeaseBeforeStart, holds it first.
	pl := e.acquireLeaseAsync(in)
	held := func() (string, error) {
		err := e.leaseResult(in, pl, func() { phase(&ph.Lease) })
		return pl.etag, err
	}
	if unsaved || e.cfg.LeaseBeforeStart {
		if _, err := held(); err != nil {
			var lh *LeaseHeldError
			return unsaved && !errors.As(err, &lh), err
		}
	}
	// Any failure from here on gives the lease back once it is held (unless fenced: no
	// writes then; or the data dir still holds unsaved state: the lease protects it). A
	// refused lease is the wake's error, whatever else failed beside it.
	defer func() {
		if err == nil {
			return
		}
		if _, lerr := held(); lerr != nil {
			err = lerr
			return
		}
		if !e.life.Fenced() && !unsaved {
			e.releaseLease(in)
		}
	}()

	in.warmGen.Store(0) // the wake consumes the standby copy's record (prewarm.go)
	s := e.syncerOf(in)
	s.Retention, s.GCGrace = kind.Retention, kind.GCGrace
	// The disk is mounted before the restore, which writes into it.
	if _, err := e.attachDisk(in, kind); err != nil {
		log.Error("attaching the space's disk", zap.Error(err))
		return unsaved, &RetryError{After: 5 * time.Second, Reason: "disk unavailable"}
	}
	// The instance starts once its state is restored, while the lease (when not held yet)
	// and then the fence's conditional PUT are in flight: it is proxied nothing before the
	// wake ends, so it acknowledges no write the lease and fence have not made safe, and
	// a refused lease or a fence that finds a newer manifest ends it first. The start
	// waits for a start slot (startGate), held until the instance first answers; that
	// wait counts in the start phase.
	var (
		p     *proc
		leave func()
		room  bool
	)
	start := func() error {
		if !room {
			if !e.admitFree(in) {
				// Room here means sleeping another space: only for a wake that holds
				// its lease.
				if _, err := held(); err != nil {
					return err
				}
				if err := e.makeRoom(in); err != nil {
					return err
				}
			}
			room = true
		}
		l, err := e.gate.enter(ctx, ticket)
		if err != nil {
			return &RetryError{After: 5 * time.Second, Reason: "box shutting down"}
		}
		np, err := e.startProcess(in, kind, sp)
		if err != nil {
			l()
			log.Error("starting instance", zap.Error(err))
			return &RetryError{After: 5 * time.Second, Reason: "instance failed to start"}
		}
		p, leave = np, l
		in.mu.Lock()
		in.proc = p
		in.mu.Unlock()
		phase(&ph.Start)
		return nil
	}
	undo := func() {
		if p == nil {
			return
		}
		e.stopProcess(in, p, kind, stopKill)
		leave()
		in.mu.Lock()
		in.proc = nil
		in.mu.Unlock()
		p, leave = nil, nil
	}
	defer func() {
		if err != nil {
			in.closeDurable(err) // a wake that failed after its log was opened
		}
	}()
	kept, err := e.restoreAndFence(ctx, in, pl, held, unsaved, &ph, phase, start, undo)
	unsaved = unsaved && kept
	if err != nil {
		return unsaved, err
	}
	restored := e.now()

	if kind.SocketActivation {
		// The kernel queues the first request until the app accepts: proxy at once. A
		// start that never answers is caught off this path (watchFirstAnswer).
		safego.Go(nil, e.log, "first answer", func() {
			defer leave()
			e.watchFirstAnswer(in, p, kind)
		})
	} else {
		err = e.awaitReady(ctx, in, p, kind)
		leave()
	}
	phase(&ph.Ready)
	if err != nil {
		e.stopProcess(in, p, kind, stopKill)
		in.mu.Lock()
		in.proc = nil
		in.mu.Unlock()
		if p.cmd.ProcessState != nil && !p.cmd.ProcessState.Success() {
			e.c.crashes.Add(1)
		}
		log.Error("instance not ready; killed", zap.Error(err), zap.Int("pid", p.pid))
		// A failed wake: runWake backs it off on failedWakeBackoff, the one curve it gets.
		return unsaved, &RetryError{After: failedWakeBackoff.First, Reason: "instance not ready"}
	}
	e.c.wakes.Add(1)
	e.startSync(in, kind)
	keptDir := in.syncer.Reused() || kept
	in.lastWakeKept.Store(keptDir)
	log.Info("awake", zap.Int("pid", p.pid), zap.Duration("restore_and_fence", restored.Sub(began)),
		zap.Bool("kept_data_dir", keptDir), zap.Duration("total", e.now().Sub(began)))
	return false, nil
}

// maxFenceTries bounds how often a wake restores again because the manifest changed
// between its read and its fence write: each retry means an earlier holder's late write
// landed, and there are only as many of those as holders paused mid-checkpoint.
const maxFenceTries = 3

// restoreAndFence runs with in.op held and the lease taken or in flight (pl; held waits
// for it on the wake's goroutine): read the manifest, restore the data dir from it (or keep
// the local one, below), start the instance (start) and, once the lease is held, beside
// the start, fence the manifest (spacestore.Syncer.Fence), so that no earlier holder's pending
// manifest write can land once this instance may acknowledge writes. A late write that
// lands between the read and the fence makes the fence fail: its state is newer, so the
// instance is ended (undo) and the manifest read and restored again. Every error return
// has undone the start.
//
// With keepLocal (a wake from StateUnsaved) the local data dir is kept when nobody wrote
// the manifest since this box last did: it is the newest state. kept reports that the data
// dir was kept, not restored over.
func (e *Engine) restoreAndFence(ctx context.Context, in *inst, pl *pendingLease, held func() (string, error), keepLocal bool, ph *WakePhases, phase func(*time.Duration),
	start func() error, undo func()) (kept bool, err error) {
	log := in.logger()
	_, lastETag := in.syncer.Manifest()
	kept = keepLocal
	for try := 1; ; try++ {
		if err := in.syncer.Load(ctx); err != nil {
			log.Error("loading manifest", zap.Error(err))
			return kept, &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
		}
		if _, cur := in.syncer.Manifest(); kept && cur == lastETag {
			// The last checkpoint failed and nobody wrote since: the local data dir is the
			// newest state. Keep it rather than restore older bytes over it.
			log.Warn("keeping local state newer than the bucket")
		} else {
			kept = false // another box wrote since: its state wins
			if err := in.syncer.Restore(ctx); err != nil {
				log.Error("restoring data dir", zap.Error(err))
				return false, &RetryError{After: 5 * time.Second, Reason: "restore failed"}
			}
		}
		m, _ := in.syncer.Manifest()
		in.mu.Lock()
		in.size = manifestSize(m)
		in.mu.Unlock()
		phase(&ph.Restore)
		if e.life.Fenced() {
			return kept, &RetryError{After: 5 * time.Second, Reason: "box fenced: bucket heartbeat failing"}
		}
		in.mu.Lock()
		logged := in.kind.Durability.Logs()
		in.mu.Unlock()
		if logged {
			// The log is read, applied and sealed before the instance starts: after the
			// lease and the fence, which its seal follows (durable.go).
			retry, err := e.fenceThenLog(ctx, in, pl, held, kept, ph, phase, start)
			if !retry {
				return kept, err
			}
			cur, _, _ := spacestore.ReadManifest(ctx, e.cfg.Bucket, in.host)
			log.Warn("manifest changed between restore and fence: restoring the newer state",
				zap.Int("try", try), manifestWriter(cur))
			if try == maxFenceTries {
				return kept, &RetryError{After: 5 * time.Second, Reason: "manifest keeps changing: another writer"}
			}
			continue
		}
		// The fence is written as soon as the lease is held, while the instance starts;
		// the syncer is the fence's until it ends, so every path waits for it.
		fence := e.fenceAsync(ctx, in, pl)
		if err := start(); err != nil {
			<-fence
			return kept, err
		}
		if _, err := held(); err != nil {
			<-fence
			undo() // refused: the instance ran on nothing this box may serve
			return kept, err
		}
		err := <-fence
		phase(&ph.Fence)
		if err == nil {
			return kept, nil
		}
		undo()
		if !errors.Is(err, spacestore.ErrFenced) {
			log.Error("fencing the manifest", zap.Error(err))
			return kept, &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
		}
		cur, _, _ := spacestore.ReadManifest(ctx, e.cfg.Bucket, in.host)
		log.Warn("manifest changed between restore and fence: restoring the newer state",
			zap.Int("try", try), manifestWriter(cur))
		if try == maxFenceTries {
			return kept, &RetryError{After: 5 * time.Second, Reason: "manifest keeps changing: another writer"}
		}
	}
}

// fenceThenLog is restoreAndFence's path for a kind that ships a log: the lease, then the
// fence, then the log read, applied and sealed (openLog), and only then the start. retry
// reports a fence that found a newer manifest: restore again.
func (e *Engine) fenceThenLog(ctx context.Context, in *inst, pl *pendingLease, held func() (string, error), kept bool,
	ph *WakePhases, phase func(*time.Duration), start func() error) (retry bool, err error) {
	log := in.logger()
	if _, err := held(); err != nil {
		if !kept {
			e.keepRestored(in)
		}
		return false, err
	}
	err = <-e.fenceAsync(ctx, in, pl)
	phase(&ph.Fence)
	if errors.Is(err, spacestore.ErrFenced) {
		return true, err
	}
	if err != nil {
		log.Error("fencing the manifest", zap.Error(err))
		return false, &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
	}
	ls, err := e.openLog(ctx, in, kept)
	if err != nil {
		log.Error("opening the space's log", zap.Error(err))
		reason := "log unavailable"
		if errors.Is(err, ErrStandbySilent) {
			reason = "waiting for the space's standby"
		}
		return false, &RetryError{After: 5 * time.Second, Reason: reason, Err: err}
	}
	phase(&ph.Restore)
	if err := start(); err != nil {
		return false, err
	}
	in.dur.Store(e.newDurable(in, ls))
	return false, nil
}

// manifestWriter is a log field naming who wrote m: the lease it was claimed under, or
// its writer (a manifest from before fencing at wake, a restore or a copy).
func manifestWriter(m *spacestore.Manifest) zap.Field {
	switch {
	case m == nil:
		return zap.Skip()
	case m.Claim != nil:
		return zap.String("manifest_claimed_by", m.Claim.Holder+"/"+m.Claim.Incarnation)
	default:
		return zap.String("manifest_written_by", m.WrittenBy)
	}
}
