package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/spacestore"
)

// stopManner is how an instance is ended.
type stopManner int

const (
	// stopGraceful sends the kind's StopSignal and kills the instance after its StopGrace
	// (at once when the signal cannot stop it: stopSignalFutile).
	stopGraceful stopManner = iota
	// stopKill kills it at once: another writer owns the space, or a wake undoes its start.
	stopKill
)

// stopOutcome is what a stop does with the space's state once the process is gone, and so
// which state the stop ends in (stopOutcome.next).
type stopOutcome int

const (
	// stopSave checkpoints the data dir and releases the lease; the checkpoint decides the
	// next state (checkpointAndRelease): asleep, fenced, unsaved or held.
	stopSave stopOutcome = iota
	// stopKeep writes nothing and keeps the lease and the local state (a heartbeat fence:
	// peers must not see this box write): held while this box holds the lease, else
	// asleep.
	stopKeep
	// stopFencedOut writes nothing: another writer owns the space. Fenced.
	stopFencedOut
	// stopDiscard writes nothing: the space is dropped next, its state with it. Asleep.
	stopDiscard
)

// next is the state a stop with outcome o ends in, from sleeping: saved is what the
// checkpoint left (stopSave only), leaseHeld whether this box holds the lease then.
func (o stopOutcome) next(saved State, leaseHeld bool) State {
	switch o {
	case stopSave:
		return saved
	case stopKeep:
		if leaseHeld {
			return StateHeld
		}
		return StateAsleep
	case stopFencedOut:
		return StateFenced
	default:
		return StateAsleep
	}
}

// stopSpec is what one stop of a running instance does besides stopping it: the causes
// (sleep, crash, heartbeat fence, fence-out, discard) differ only in these fields, and all
// go through stopOpHeld.
type stopSpec struct {
	// reason names the cause in logs and events: idle, lru, requested, drain, removed,
	// unreachable, crash, fence, fenced out, discard.
	reason string
	// unless, called with in.mu held before anything is done, cancels the stop (an idle
	// sleep of a space used meanwhile).
	unless func() bool
	// exited is the process that exited on its own (a crash): it is the one to stop, and
	// only if it is still the instance's.
	exited *proc
	// manner is how the process is ended: gracefully, or killed at once when another
	// writer owns the space.
	manner stopManner
	// grace, when set, caps the kind's stop grace (a heartbeat fence: peers take the
	// space over soon).
	grace time.Duration
	// outcome is what is done with the space's state once the process is gone.
	outcome stopOutcome
	// begin and end run with in.mu held: begin once the stop started, end with the
	// next state just set (bookkeeping of the cause). stopped runs with no lock held
	// once the process is gone, before the save (logs and events of the cause).
	begin   func()
	stopped func()
	end     func(next State)
}

// stopOpHeld is the one stop path (in.op held): an awake space goes to StateSleeping, its
// idle timer and replication loop stop, its process is stopped as spec says, its state is
// saved or kept, and the space moves to the next state. It reports whether it stopped
// anything (the space was awake and unless did not cancel); err is the save's.
func (e *Engine) stopOpHeld(ctx context.Context, in *inst, spec stopSpec) (stopped bool, err error) {
	in.mu.Lock()
	if in.state != StateAwake || spec.exited != nil && in.proc != spec.exited || spec.unless != nil && spec.unless() {
		in.mu.Unlock()
		return false, nil
	}
	in.setStateLocked(StateSleeping)
	in.disarmIdleLocked()
	in.stopSyncLocked()
	p, kind := in.proc, in.kind
	if spec.exited != nil {
		in.proc = nil // gone already: Status shows no pid while the state is saved
	}
	if spec.begin != nil {
		spec.begin()
	}
	in.mu.Unlock()

	if spec.exited == nil {
		if spec.grace > 0 && kind.StopGrace > spec.grace {
			kind.StopGrace = spec.grace
		}
		e.stopProcess(in, p, kind, spec.manner)
	}
	if spec.stopped != nil {
		spec.stopped()
	}
	// The instance is gone: answers still waiting at its gate get 503 (what they carried
	// is in the final checkpoint, or was never acknowledged), and a shipment stuck on the
	// bucket is cancelled rather than waited for by that checkpoint.
	retire, claim := in.streamToRetire()
	in.closeDurable(nil)
	var saved State
	if spec.outcome == stopSave {
		saved, err = e.checkpointAndRelease(ctx, in)
		if err == nil && retire != nil && in.checkpointedPast(retire.gen) {
			e.retireStream(ctx, in, retire, claim, spec.reason == "drain")
		}
	}

	in.mu.Lock()
	in.proc = nil
	next := spec.outcome.next(saved, in.leaseETag != "")
	in.setStateLocked(next)
	if spec.end != nil {
		spec.end(next)
	}
	in.mu.Unlock()
	return true, err
}

// Sleep stops the space now, checkpoints it and releases its lease.
func (e *Engine) Sleep(ctx context.Context, host string) error {
	in := e.lookup(host)
	if in == nil {
		return nil
	}
	return e.sleep(ctx, in, "requested")
}

// The sleep reasons with a rule of their own: the idle timer's (the space must still be
// idle), and the awake cap's (the space must still be unused).
const (
	reasonIdle = "idle"
	reasonLRU  = "lru"
)

// sleep stops, checkpoints and releases an awake space. An idle sleep does nothing when
// the space was used since its timer decided (and re-arms the timer); an lru sleep does
// nothing when a Use appeared.
func (e *Engine) sleep(ctx context.Context, in *inst, reason string) error {
	in.op.Lock()
	defer in.op.Unlock()
	spec := stopSpec{reason: reason, outcome: stopSave,
		end: func(next State) {
			if next != StateFenced {
				in.crashes = 0
			}
		}}
	switch reason {
	case reasonIdle:
		spec.unless = func() bool {
			due, wait := in.idleDueLocked(e.now())
			if !due && in.idle != nil {
				in.idle.Reset(wait)
			}
			return !due
		}
	case reasonLRU:
		spec.unless = func() bool { return in.uses > 0 || in.waiters > 0 }
	}
	stopped, err := e.stopOpHeld(ctx, in, spec)
	if !stopped {
		return nil
	}
	e.c.sleeps.Add(1)
	in.logger().Info("asleep", zap.String("reason", reason), zap.Error(err))
	e.emit(Event{Type: EventSleep, Host: in.host, Reason: reason})
	return err
}

// onExit runs when the instance process exits on its own: a crash. Log, checkpoint (SQLite is
// crash-safe), release, mark asleep with backoff.
func (e *Engine) onExit(in *inst, p *proc, status error) {
	if p.stopping.Load() {
		return
	}
	in.op.Lock()
	defer in.op.Unlock()
	var n int
	why := fmt.Sprint(status)
	if w := p.exitWhy.Load(); w != nil {
		why = (*w).Error()
	} else if p.pidNS && !p.answered.Load() {
		why = "exited before its first answer on the passed socket: " + why
	}
	spec := stopSpec{reason: "crash", exited: p, outcome: stopSave,
		begin: func() {
			in.crashes++
			n = in.crashes
			if p.oomKills > 0 {
				why = fmt.Sprintf("out of memory: killed by the kernel at the kind's memory limit (%d bytes)", in.kind.Limits.MemoryBytes)
			}
			in.lastCrash = why
		},
		stopped: func() {
			e.c.crashes.Add(1)
			e.emit(Event{Type: EventCrash, Host: in.host, Reason: fmt.Sprint(status)})
			if p.oomKills > 0 {
				e.c.oomKills.Add(1)
			}
			in.logger().Error("instance exited unexpectedly", zap.Int("pid", p.pid), zap.String("status", why),
				zap.Int("consecutive_crashes", n), zap.String("log", in.logPath))
		},
		end: func(State) {
			if b := crashBackoff.After(n); b > 0 {
				in.retryLaterLocked(e.now().Add(b), "instance crashing")
			}
		}}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 5*time.Minute)
	defer cancel()
	e.stopOpHeld(ctx, in, spec)
}

// fenceStop stops an awake space of a box whose heartbeat writes fail: nothing is written,
// the lease and local state are kept (StateHeld) until the box unfences and rechecks.
func (e *Engine) fenceStop(in *inst) {
	// A sync in flight holds the op lock while it waits on the bucket this box can no
	// longer reach: cancel it first so the stop is not held up.
	in.mu.Lock()
	in.stopSyncLocked()
	in.mu.Unlock()
	in.op.Lock()
	defer in.op.Unlock()
	e.stopOpHeld(e.ctx, in, stopSpec{reason: "fence", grace: e.cfg.FenceStopGrace, outcome: stopKeep})
}

// fenceOut handles a lost manifest swap (with in.op held): another writer owns the space.
// The lease is forgotten (never released: it is not ours), an awake instance is killed at
// once, and nothing more is written. A stop in progress (the swap was its final
// checkpoint's) ends fenced out by its own outcome.
func (e *Engine) fenceOut(in *inst) {
	in.mu.Lock()
	in.leaseETag = ""
	in.retryLaterLocked(e.now().Add(time.Second), "fenced out by another writer")
	in.mu.Unlock()
	e.stopOpHeld(e.ctx, in, stopSpec{reason: "fenced out", manner: stopKill, outcome: stopFencedOut})
	e.c.fenced.Add(1)
	cur, _, _ := spacestore.ReadManifest(e.ctx, e.cfg.Bucket, in.host)
	in.logger().Error("manifest changed behind this box: instance killed, space fenced out", manifestWriter(cur))
	e.emit(Event{Type: EventFence, Host: in.host, Reason: "fenced out by another writer"})
}

// checkpointAndRelease runs after the process stopped (in.op held): record the next
// scheduled wake, checkpoint and release the lease. It returns the state the space is in
// then: StateAsleep when saved (or there was nothing to save); StateFenced when the swap
// was lost; StateUnsaved, keeping the lease, when the checkpoint failed (this box has
// state the bucket lacks: without a renewal protocol the lease stays ours until this
// incarnation dies, the next wake here keeps the local state, and Drain tries again);
// StateHeld, writing nothing, on a fenced box (SetFenced(false) re-reads its lease).
func (e *Engine) checkpointAndRelease(ctx context.Context, in *inst) (State, error) {
	if e.life.Fenced() {
		in.mu.Lock()
		held := in.leaseETag != ""
		in.mu.Unlock()
		if held {
			return StateHeld, nil
		}
		return StateAsleep, nil
	}
	if in.syncer == nil {
		e.releaseLease(in)
		return StateAsleep, nil
	}
	log := in.logger()
	next, err := spacestore.ReadNextWake(in.dataDir)
	if err != nil {
		if errors.Is(err, spacestore.ErrNotRegular) {
			e.c.skippedFiles.Add(1)
		}
		log.Warn("ignoring next-wake", zap.Error(err))
	}
	if next != nil && !next.After(e.now()) {
		next = nil
	}
	prev, _ := in.syncer.Manifest()
	err = e.checkpointOpHeld(ctx, in, spacestore.Final, next) // the instance has stopped: fold the delta chains for the next wake
	if errors.Is(err, spacestore.ErrFenced) {
		return StateFenced, err
	}
	if err != nil {
		return StateUnsaved, err
	}
	switch {
	case next != nil:
		e.setWakeRecord(ctx, in.host, next)
	case prev != nil && prev.NextWake != nil:
		e.setWakeRecord(ctx, in.host, nil)
	}
	e.releaseLease(in)
	return StateAsleep, nil
}

// checkpointOpHeld checkpoints with in.op held. A lost swap fences the space out (fenceOut).
func (e *Engine) checkpointOpHeld(ctx context.Context, in *inst, mode spacestore.Mode, next *time.Time) error {
	if e.life.Fenced() {
		return errFencedNoWrite
	}
	began := e.now()
	// The box reads the data dir with privileges the space lacks, and the space owns
	// every name in it: a running instance could swap a file for a symlink to the
	// registry between the walk and the read. An isolated instance is frozen while the
	// box reads (a checkpoint at sleep runs after it is gone).
	in.mu.Lock()
	p := in.proc
	in.mu.Unlock()
	if p != nil && p.isolated && !p.done() {
		if err := p.group.Freeze(); err == nil {
			defer p.group.Thaw()
		} else if !p.done() {
			in.logger().Error("checkpoint: freezing the instance", zap.Error(err))
			return err
		}
	}
	// Shipping waits for the checkpoint: one that swaps a new generation covers every
	// segment before it, and the log starts again under it (durable.go).
	// d.mu is let go before anything below: a lost swap fences the space out here, and the
	// stop that follows closes the gate, whose cut loop may be waiting for d.mu.
	d := in.durableOf()
	if d != nil {
		d.mu.Lock()
	}
	st, err := in.syncer.Checkpoint(ctx, mode, next, e.now())
	if d != nil {
		if err == nil {
			e.newGeneration(in, d)
		}
		d.unsure.Store(in.syncer.Unsure())
		d.mu.Unlock()
	}
	ev := Event{Type: EventCheckpoint, Host: in.host, Started: began, Duration: e.now().Sub(began), Bytes: st.BytesUploaded}
	e.noteSkipped(in, st.Skipped)
	in.mu.Lock()
	if err == nil {
		in.lastSync = e.now()
		in.lastSyncErr = ""
		m, _ := in.syncer.Manifest()
		in.size = manifestSize(m)
	} else {
		in.lastSyncErr = err.Error()
		ev.Err = err.Error()
	}
	ev.Size = in.size
	in.mu.Unlock()
	e.emit(ev)
	if errors.Is(err, spacestore.ErrFenced) {
		e.fenceOut(in)
		return err
	}
	if err != nil {
		in.logger().Error("checkpoint", zap.Error(err))
		return err
	}
	e.c.blobsUploaded.Add(uint64(st.BlobsUploaded))
	e.c.bytesUploaded.Add(uint64(st.BytesUploaded))
	if st.ManifestWritten {
		e.c.syncs.Add(1)
	}
	if st.HistoryErr != nil {
		in.logger().Warn("recording checkpoint history", zap.Error(st.HistoryErr))
	}
	if st.GCErr != nil {
		in.logger().Warn("collecting garbage", zap.Error(st.GCErr))
	} else if gc := st.GC; gc != nil {
		in.logger().Info("collected garbage", zap.Int("deleted", gc.Deleted), zap.Int64("bytes_deleted", gc.BytesDeleted),
			zap.Int("history_expired", gc.HistoryDeleted), zap.Int("objects", gc.Objects), zap.Int64("bytes", gc.Bytes))
	}
	return nil
}

// releaseLease gives the space's lease back, if this box holds it.
func (e *Engine) releaseLease(in *inst) {
	in.mu.Lock()
	etag := in.leaseETag
	in.leaseETag = ""
	in.mu.Unlock()
	if etag == "" {
		return
	}
	// Release even when the caller's context is ending (drain): a bounded write of our own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 30*time.Second)
	defer cancel()
	released, err := spacestore.ReleaseLease(ctx, e.cfg.Bucket, in.host, etag, e.holder, e.now())
	if err != nil {
		in.logger().Warn("releasing lease", zap.Error(err))
	}
	in.mu.Lock()
	in.releasedETag = released
	in.mu.Unlock()
}
