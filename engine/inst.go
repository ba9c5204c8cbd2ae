package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/DeRuina/timberjack"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/space"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// inst is one space on this box.
type inst struct {
	e       *Engine
	host    string
	dir     string // StateDir/spaces/<host>
	dataDir string
	socket  string
	link    string // the box's link to the socket the instance bound (socket.go)
	dial    string // "unix/" + link: the reverse proxy's dial address
	logPath string

	// op serializes the operations that touch the process and the bucket (wake, sleep,
	// checkpoint, fence); it is held across I/O. Lock order: op before mu.
	op     sync.Mutex
	syncer *space.Syncer // guarded by op

	// here mirrors state for lock-free readers (Engine.Awake): true while waking or
	// awake. Written only by setStateLocked, with mu held.
	here atomic.Bool
	// rechecking is set while a recheck after a fence is queued or running, so requests
	// to a held space start at most one.
	rechecking atomic.Bool

	mu        sync.Mutex
	sp        Space
	kind      Kind
	state     string
	since     time.Time
	uses      int         // Uses held in the current awake period
	gen       uint64      // awake period; a Use from an earlier one no longer counts
	waiters   int         // Acquires waiting on trans
	lastUsed  time.Time   // LRU order, and the idle clock: set by every Acquire and Release
	trans     *transition // non-nil while waking or sleeping
	proc      *proc
	leaseETag string // "" when this box does not hold the lease
	held      bool   // stopped by a heartbeat fence with the lease and newer local state
	dirty     bool   // asleep with local state newer than the bucket (a failed checkpoint)
	// unreachableGen is the awake period last reported unreachable (Use.Unreachable).
	unreachableGen uint64
	// dropped is set when the space is forgotten (dropLocked): this inst never wakes
	// again; an Acquire holding it looks the host up anew once the drop is done.
	dropped     bool
	idle        *time.Timer // one per awake period; re-arms itself while the space is used
	idleGen     uint64
	syncStop    context.CancelFunc
	crashes     int  // consecutive
	wakeFails   int  // consecutive failed wakes (backoff.go)
	admitted    bool // a waking space counted under MaxAwake (capacity.go)
	retryAt     time.Time
	retryWhy    string
	lastSync    time.Time
	lastSyncErr string
	size        int64 // bytes of the files in the manifest last read or written here
	lastCrash   string
	logw        *timberjack.Logger // instance.log, capped and rotated; created by the first start
}

// transition is one wake or sleep in flight; waiters block on done.
type transition struct {
	done chan struct{}
	err  error // set before done is closed
}

func newInst(e *Engine, host string) *inst {
	dir := filepath.Join(e.cfg.StateDir, "spaces", host)
	sock := socketPath(e.cfg.StateDir, host)
	return &inst{
		e:       e,
		host:    host,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		socket:  sock,
		link:    proxyPath(e.cfg.StateDir, host),
		dial:    "unix/" + proxyPath(e.cfg.StateDir, host),
		logPath: filepath.Join(dir, "instance.log"),
		state:   StateAsleep,
		since:   e.now(),
	}
}

// socketPath keeps socket paths short (sun_path is 108 bytes) whatever the host's length.
// Each space has its own directory, which an isolated space's uid owns.
func socketPath(stateDir, host string) string {
	sum := sha256.Sum256([]byte(host))
	return filepath.Join(stateDir, "run", hex.EncodeToString(sum[:8]), "s.sock")
}

func (in *inst) logger() *zap.Logger { return in.e.log.With(zap.String("host", in.host)) }

func (in *inst) setStateLocked(s string) {
	in.state = s
	in.since = in.e.now()
	in.here.Store(s == StateAwake || s == StateWaking)
}

// Use is one holder of an awake space. Release it when the request and any hijacked
// connection are finished.
type Use struct {
	in       *inst
	gen      uint64
	socket   string
	pid      int       // the instance's process
	since    time.Time // when it woke
	released atomic.Bool
}

// Instance names the awake instance this Use holds: its process id and wake time. Two
// answers with the same Instance came from one instance.
func (u *Use) Instance() string { return fmt.Sprintf("%d@%d", u.pid, u.since.UnixNano()) }

// Socket is the Unix socket to proxy to: the box's own link to the socket the
// instance bound, never a path the instance controls.
func (u *Use) Socket() string { return u.socket }

// Dial is the socket as a Caddy network address ("unix/<path>"), for a reverse proxy.
func (u *Use) Dial() string { return u.in.dial }

// Release ends the use; the space sleeps IdleTimeout after its last use is released.
// Idempotent. It only counts and stamps: the idle timer checks lastUsed when it fires, so
// the request path never creates or stops a timer.
func (u *Use) Release() {
	if u.released.Swap(true) {
		return
	}
	in := u.in
	now := in.e.now()
	in.mu.Lock()
	if u.gen == in.gen {
		in.uses--
	}
	in.lastUsed = now
	in.mu.Unlock()
}

// Unreachable reports that the proxy could not dial this Use's instance (its socket gone
// or refusing) while the engine holds it awake: every request would fail until something
// else ended the awake period. The space is put to sleep (stopped, checkpointed, released)
// in the background, once per awake period, so the next request wakes a working instance.
func (u *Use) Unreachable() {
	if u == nil {
		return
	}
	in := u.in
	e := in.e
	in.mu.Lock()
	if u.gen != in.gen || in.state != StateAwake || in.unreachableGen == u.gen || in.dropped {
		in.mu.Unlock()
		return
	}
	in.unreachableGen = u.gen
	in.mu.Unlock()
	in.logger().Warn("instance unreachable on its socket; putting the space to sleep so the next request wakes it again")
	safego.Go(&e.wg, e.log, "sleep unreachable", func() {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := e.sleep(ctx, in, "unreachable", false); err != nil {
			in.logger().Warn("sleeping an unreachable instance", zap.Error(err))
		}
	})
}

// Acquire wakes the space if needed (all concurrent callers share one wake), marks it in use
// and returns a Use.
func (e *Engine) Acquire(ctx context.Context, sp Space) (*Use, error) {
	kind, ok := e.kind(sp.Kind)
	if !ok {
		return nil, ErrUnknownKind
	}
	if !validHost(sp.Host) {
		return nil, fmt.Errorf("invalid host %q", sp.Host)
	}
	return e.acquire(ctx, sp, kind, e.get(sp.Host))
}

// acquire is Acquire's loop, starting from in (the host's inst when Acquire looked).
func (e *Engine) acquire(ctx context.Context, sp Space, kind Kind, in *inst) (*Use, error) {
	// waiting is true while this caller still counts in in.waiters after a transition
	// ended: it stops counting in the same critical section that takes the Use, so a
	// space just woken for it is never idle (uses and waiters both 0) in between, where
	// the awake cap could pick it as the space to sleep.
	waiting := false
	defer func() {
		if waiting {
			in.mu.Lock()
			in.waiters--
			in.mu.Unlock()
		}
	}()
	for {
		if e.ctx.Err() != nil {
			return nil, &RetryError{After: 5 * time.Second, Reason: "box shutting down"}
		}
		if e.fenced.Load() || e.cfg.Fresh != nil && !e.cfg.Fresh() {
			return nil, &RetryError{After: 5 * time.Second, Reason: "box fenced: bucket heartbeat failing"}
		}
		in.mu.Lock()
		if waiting {
			in.waiters--
			waiting = false
		}
		if in.dropped {
			// Forgotten (removed, tombstoned) since this caller found it: waking it
			// would run a second instance beside the one a new inst for the host
			// wakes, on the same socket path. Wait for the drop to end (it holds op
			// until the inst is out of the map) and take the host's current inst.
			in.mu.Unlock()
			in.op.Lock()
			in.op.Unlock()
			in = e.get(sp.Host)
			continue
		}
		switch in.state {
		case StateAwake:
			in.uses++
			in.lastUsed = e.now()
			u := &Use{in: in, gen: in.gen, socket: in.link, since: in.since}
			if in.proc != nil {
				u.pid = in.proc.pid
			}
			in.mu.Unlock()
			return u, nil
		case StateWaking, StateSleeping:
			t := in.trans
			waking := in.state == StateWaking
			in.waiters++
			in.mu.Unlock()
			err := in.wait(ctx, t)
			waiting = err == nil
			if err != nil {
				return nil, err
			}
			if waking && t.err != nil && !errors.Is(t.err, errDropped) {
				return nil, t.err
			}
		default: // asleep, failed, fenced
			if e.draining.Load() {
				// A draining box serves its awake spaces until the drain puts them to
				// sleep, and wakes none.
				in.mu.Unlock()
				return nil, ErrDraining
			}
			if in.held {
				in.mu.Unlock()
				if in.rechecking.CompareAndSwap(false, true) {
					held := in // in changes when a dropped inst is replaced
					safego.Go(&e.wg, e.log, "recheck", func() {
						defer held.rechecking.Store(false)
						e.recheck(held)
					})
				}
				return nil, &RetryError{After: time.Second, Reason: "re-checking lease after fence"}
			}
			if wait := in.retryAt.Sub(e.now()); wait > 0 {
				why := in.retryWhy
				in.mu.Unlock()
				return nil, &RetryError{After: ceilSecond(wait), Reason: why}
			}
			in.sp, in.kind = sp, kind
			t := &transition{done: make(chan struct{})}
			in.trans = t
			in.setStateLocked(StateWaking)
			in.waiters++
			in.mu.Unlock()
			waker := in // in changes when a dropped inst is replaced
			safego.Go(&e.wg, e.log, "wake", func() { e.runWake(waker, t) })
			err := in.wait(ctx, t)
			waiting = err == nil
			if err != nil {
				return nil, err
			}
			if t.err != nil && !errors.Is(t.err, errDropped) {
				return nil, t.err
			}
		}
	}
}

// errDropped is a wake's end when its space was forgotten before the wake could start;
// the callers waiting on it look the host up again.
var errDropped = errors.New("space forgotten before its wake started")

// wait blocks until t is done or ctx ends. When ctx ends it drops this caller from the
// waiters; when t is done the caller still counts and drops itself (Acquire).
func (in *inst) wait(ctx context.Context, t *transition) error {
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		in.mu.Lock()
		in.waiters--
		in.mu.Unlock()
		return ctx.Err()
	}
}

// armIdleLocked starts the idle timer of an awake period. The timer re-arms itself for as
// long as the space is in use or was used within IdleTimeout (idleCheck).
func (in *inst) armIdleLocked() {
	in.disarmIdleLocked()
	if in.state != StateAwake || in.e.ctx.Err() != nil {
		return
	}
	gen := in.idleGen
	in.idle = time.AfterFunc(in.kind.IdleTimeout, func() { in.idleCheck(gen) })
}

// idleDueLocked reports whether the space has been idle for IdleTimeout, and otherwise how
// long until it could be.
func (in *inst) idleDueLocked(now time.Time) (bool, time.Duration) {
	timeout := in.kind.IdleTimeout
	if in.uses > 0 || in.waiters > 0 {
		return false, timeout
	}
	if wait := in.lastUsed.Add(timeout).Sub(now); wait > 0 {
		return false, wait
	}
	return true, 0
}

// idleCheck runs when the idle timer fires: sleep the space if it is due, else re-arm.
func (in *inst) idleCheck(gen uint64) {
	e := in.e
	in.mu.Lock()
	if gen != in.idleGen || in.state != StateAwake || e.ctx.Err() != nil {
		in.mu.Unlock()
		return
	}
	if due, wait := in.idleDueLocked(e.now()); !due {
		in.idle.Reset(wait)
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()
	safego.Go(&e.wg, e.log, "idle sleep", func() { e.idleFire(in, gen) })
}

func (in *inst) disarmIdleLocked() {
	in.idleGen++
	if in.idle != nil {
		in.idle.Stop()
		in.idle = nil
	}
}

func (e *Engine) idleFire(in *inst, gen uint64) {
	in.mu.Lock()
	stale := gen != in.idleGen || in.state != StateAwake
	in.mu.Unlock()
	if stale {
		return
	}
	if err := e.sleep(e.ctx, in, reasonIdle, true); err != nil {
		in.logger().Error("idle sleep", zap.Error(err))
	}
}

// runWake performs one wake and publishes its result to the waiters.
func (e *Engine) runWake(in *inst, t *transition) {
	in.op.Lock()
	in.mu.Lock()
	dropped := in.dropped
	in.mu.Unlock()
	err := errDropped
	if !dropped {
		err = e.wake(in)
	}
	in.mu.Lock()
	in.trans = nil
	in.admitted = false
	if !dropped {
		in.noteWakeResultLocked(err)
	}
	if err != nil {
		t.err = err
		if in.state == StateWaking {
			in.setStateLocked(StateAsleep)
			var re *RetryError
			if errors.As(err, &re) && !errors.Is(err, errAwakeCap) {
				in.setStateLocked(StateFailed)
			}
		}
	} else {
		in.setStateLocked(StateAwake)
		in.gen++
		in.uses = 0
		in.lastUsed = e.now()
		in.armIdleLocked()
	}
	close(t.done)
	in.mu.Unlock()
	in.op.Unlock()
}

// wake runs with in.op held: make room, lease, restore, start, await readiness.
func (e *Engine) wake(in *inst) (err error) {
	ctx := e.ctx
	log := in.logger()
	start := e.now()
	in.mu.Lock()
	sp, kind := in.sp, in.kind
	in.mu.Unlock()

	// A wake the awake cap would refuse costs nothing; room is made (another space put
	// to sleep) only once the lease is ours and the state restored, right before the
	// start, so a wake that fails on the bucket never evicts anyone.
	if err := e.checkRoom(in); err != nil {
		return err
	}

	// Observers hear each phase's duration, for "why was that wake slow".
	var ph WakePhases
	mark := e.now()
	phase := func(d *time.Duration) {
		now := e.now()
		*d, mark = now.Sub(mark), now
	}
	defer func() {
		ev := Event{Type: EventWake, Host: in.host, Phases: ph}
		in.mu.Lock()
		ev.Size = in.size
		in.mu.Unlock()
		if err != nil {
			ev.Err = err.Error()
		}
		e.emit(ev)
	}()

	etag, err := space.AcquireLease(ctx, e.cfg.Bucket, in.host, e.holder, e.now())
	phase(&ph.Lease)
	var held *space.LeaseHeldError
	if errors.As(err, &held) {
		e.c.leaseConflicts.Add(1)
		return &LeaseHeldError{Holder: held.Holder}
	}
	if err != nil {
		log.Error("acquiring lease", zap.Error(err))
		return &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
	}
	in.mu.Lock()
	in.leaseETag = etag
	in.mu.Unlock()
	// Any failure from here on gives the lease back (unless fenced: no writes then).
	defer func() {
		if err != nil && !e.fenced.Load() {
			e.releaseLease(in)
		}
	}()

	if in.syncer == nil {
		in.syncer = &space.Syncer{Bucket: e.cfg.Bucket, Host: in.host, DataDir: in.dataDir,
			WorkDir: filepath.Join(in.dir, "work"), WrittenBy: e.cfg.Holder}
	}
	in.syncer.Retention, in.syncer.GCGrace = kind.Retention, kind.GCGrace
	if err := e.restoreAndFence(ctx, in, etag, &ph, phase); err != nil {
		return err
	}
	restored := e.now()

	if err := e.makeRoom(in); err != nil {
		return err
	}
	p, err := e.startProcess(in, kind, sp)
	if err != nil {
		log.Error("starting instance", zap.Error(err))
		return &RetryError{After: 5 * time.Second, Reason: "instance failed to start"}
	}
	in.mu.Lock()
	in.proc = p
	in.mu.Unlock()
	phase(&ph.Start)
	err = e.awaitReady(ctx, in, p, kind)
	phase(&ph.Ready)
	if err != nil {
		p.stopping.Store(true)
		p.kill()
		<-p.exited
		in.mu.Lock()
		in.proc = nil
		in.crashes++
		if p.cmd.ProcessState != nil && !p.cmd.ProcessState.Success() {
			e.c.crashes.Add(1)
		}
		backoff := max(crashBackoff(in.crashes), time.Second)
		in.retryAt = e.now().Add(backoff)
		in.retryWhy = "instance not ready"
		in.mu.Unlock()
		log.Error("instance not ready; killed", zap.Error(err), zap.Int("pid", p.pid))
		return &RetryError{After: backoff, Reason: "instance not ready"}
	}
	e.c.wakes.Add(1)
	e.startSync(in, kind)
	log.Info("awake", zap.Int("pid", p.pid), zap.Duration("restore", restored.Sub(start)),
		zap.Bool("kept_data_dir", in.syncer.Reused()), zap.Duration("total", e.now().Sub(start)))
	return nil
}

// maxFenceTries bounds how often a wake restores again because the manifest changed
// between its read and its fence write: each retry means an earlier holder's late write
// landed, and there are only as many of those as holders paused mid-checkpoint.
const maxFenceTries = 3

// restoreAndFence runs with in.op held and the lease taken (leaseETag): read the manifest,
// restore the data dir from it (or keep the local one, below) and fence the manifest
// (space.Syncer.Fence), so that no earlier holder's pending manifest write can land once
// this instance may acknowledge writes. A late write that lands between the read and the
// fence makes the fence fail: its state is newer, so read and restore again.
func (e *Engine) restoreAndFence(ctx context.Context, in *inst, leaseETag string, ph *WakePhases, phase func(*time.Duration)) error {
	log := in.logger()
	_, lastETag := in.syncer.Manifest()
	for try := 1; ; try++ {
		if err := in.syncer.Load(ctx); err != nil {
			log.Error("loading manifest", zap.Error(err))
			return &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
		}
		in.mu.Lock()
		dirty := in.dirty
		in.mu.Unlock()
		if _, cur := in.syncer.Manifest(); dirty && cur == lastETag {
			// The last checkpoint failed and nobody wrote since: the local data dir is the
			// newest state. Keep it rather than restore older bytes over it.
			log.Warn("keeping local state newer than the bucket")
		} else if err := in.syncer.Restore(ctx); err != nil {
			log.Error("restoring data dir", zap.Error(err))
			return &RetryError{After: 5 * time.Second, Reason: "restore failed"}
		}
		m, _ := in.syncer.Manifest()
		in.mu.Lock()
		in.dirty = false
		in.size = manifestSize(m)
		in.mu.Unlock()
		phase(&ph.Restore)
		if e.fenced.Load() {
			return &RetryError{After: 5 * time.Second, Reason: "box fenced: bucket heartbeat failing"}
		}
		err := in.syncer.Fence(ctx, space.Claim{Holder: e.holder.ID, Incarnation: e.holder.Incarnation, Lease: leaseETag, At: e.now()})
		phase(&ph.Fence)
		if err == nil {
			return nil
		}
		if !errors.Is(err, space.ErrFenced) {
			log.Error("fencing the manifest", zap.Error(err))
			return &RetryError{After: 5 * time.Second, Reason: "bucket unavailable"}
		}
		cur, _, _ := space.ReadManifest(ctx, e.cfg.Bucket, in.host)
		log.Warn("manifest changed between restore and fence: restoring the newer state",
			zap.Int("try", try), manifestWriter(cur))
		if try == maxFenceTries {
			return &RetryError{After: 5 * time.Second, Reason: "manifest keeps changing: another writer"}
		}
	}
}

// manifestWriter is a log field naming who wrote m: the lease it was claimed under, or
// its writer (a manifest from before fencing at wake, a restore or a copy).
func manifestWriter(m *space.Manifest) zap.Field {
	switch {
	case m == nil:
		return zap.Skip()
	case m.Claim != nil:
		return zap.String("manifest_claimed_by", m.Claim.Holder+"/"+m.Claim.Incarnation)
	default:
		return zap.String("manifest_written_by", m.WrittenBy)
	}
}

// Sleep stops the space now, checkpoints it and releases its lease.
func (e *Engine) Sleep(ctx context.Context, host string) error {
	in := e.lookup(host)
	if in == nil {
		return nil
	}
	return e.sleep(ctx, in, "requested", false)
}

// reasonIdle is the sleep reason of the idle timer.
const reasonIdle = "idle"

// sleep stops, checkpoints and releases. With onlyIdle it does nothing when a Use appeared;
// an idle sleep also does nothing when the space was used since its timer decided, and
// re-arms the timer instead.
func (e *Engine) sleep(ctx context.Context, in *inst, reason string, onlyIdle bool) error {
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	if in.state != StateAwake {
		in.mu.Unlock()
		return nil
	}
	if reason == reasonIdle {
		if due, wait := in.idleDueLocked(e.now()); !due {
			if in.idle != nil {
				in.idle.Reset(wait)
			}
			in.mu.Unlock()
			return nil
		}
	} else if onlyIdle && (in.uses > 0 || in.waiters > 0) {
		in.mu.Unlock()
		return nil
	}
	t := &transition{done: make(chan struct{})}
	in.trans = t
	in.setStateLocked(StateSleeping)
	in.disarmIdleLocked()
	p, kind := in.proc, in.kind
	in.stopSyncLocked()
	in.mu.Unlock()

	e.stopProcess(in, p, kind)
	err := e.checkpointAndRelease(ctx, in)

	in.mu.Lock()
	in.proc = nil
	in.trans = nil
	if errors.Is(err, space.ErrFenced) {
		in.setStateLocked(StateFenced)
	} else {
		in.setStateLocked(StateAsleep)
		in.crashes = 0
	}
	close(t.done)
	in.mu.Unlock()
	e.c.sleeps.Add(1)
	in.logger().Info("asleep", zap.String("reason", reason), zap.Error(err))
	e.emit(Event{Type: EventSleep, Host: in.host, Reason: reason})
	return err
}

// checkpointAndRelease runs after the process stopped: record the next scheduled wake,
// checkpoint and release the lease. On a fenced box nothing is written; the space is held
// until SetFenced(false) re-reads its lease.
func (e *Engine) checkpointAndRelease(ctx context.Context, in *inst) error {
	if e.fenced.Load() {
		in.mu.Lock()
		in.held = in.leaseETag != ""
		in.mu.Unlock()
		return nil
	}
	if in.syncer == nil {
		e.releaseLease(in)
		return nil
	}
	log := in.logger()
	next, err := space.ReadNextWake(in.dataDir)
	if err != nil {
		if errors.Is(err, space.ErrNotRegular) {
			e.c.skippedFiles.Add(1)
		}
		log.Warn("ignoring next-wake", zap.Error(err))
	}
	if next != nil && !next.After(e.now()) {
		next = nil
	}
	prev, _ := in.syncer.Manifest()
	err = e.checkpointLocked(ctx, in, space.Final, next) // the instance has stopped: fold the delta chains for the next wake
	if err != nil {
		if errors.Is(err, space.ErrFenced) {
			return err
		}
		// Keep the lease: this box has state the bucket lacks. Without a renewal protocol
		// the lease stays ours until this incarnation dies; the next wake here keeps the
		// local state, and Drain tries the checkpoint again.
		in.mu.Lock()
		in.dirty = true
		in.mu.Unlock()
		return err
	}
	switch {
	case next != nil:
		e.setWakeRecord(ctx, in.host, next)
	case prev != nil && prev.NextWake != nil:
		e.setWakeRecord(ctx, in.host, nil)
	}
	e.releaseLease(in)
	return nil
}

// checkpointLocked checkpoints with in.op held. A fenced result stops the instance at once.
func (e *Engine) checkpointLocked(ctx context.Context, in *inst, mode space.Mode, next *time.Time) error {
	if e.fenced.Load() {
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
	st, err := in.syncer.Checkpoint(ctx, mode, next, e.now())
	ev := Event{Type: EventCheckpoint, Host: in.host, Duration: e.now().Sub(began), Bytes: st.BytesUploaded}
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
	if errors.Is(err, space.ErrFenced) {
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

// fenceOut handles a lost manifest swap (with in.op held): another writer owns the space. Kill
// the instance at once, write nothing more, forget the lease.
func (e *Engine) fenceOut(in *inst) {
	in.mu.Lock()
	p := in.proc
	in.stopSyncLocked()
	in.disarmIdleLocked()
	in.leaseETag = ""
	in.held = false
	in.retryAt = e.now().Add(time.Second)
	in.retryWhy = "fenced out by another writer"
	in.mu.Unlock()
	if p != nil {
		p.stopping.Store(true)
		p.kill()
		<-p.exited
	}
	in.mu.Lock()
	in.proc = nil
	if in.state == StateAwake {
		in.setStateLocked(StateFenced)
	}
	in.mu.Unlock()
	e.c.fenced.Add(1)
	cur, _, _ := space.ReadManifest(e.ctx, e.cfg.Bucket, in.host)
	in.logger().Error("manifest changed behind this box: instance killed, space fenced out", manifestWriter(cur))
	e.emit(Event{Type: EventFence, Host: in.host, Reason: "fenced out by another writer"})
}

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
	if err := space.ReleaseLease(ctx, e.cfg.Bucket, in.host, etag, e.holder, e.now()); err != nil {
		in.logger().Warn("releasing lease", zap.Error(err))
	}
}

// onExit runs when the instance process exits on its own: a crash. Log, checkpoint (SQLite is
// crash-safe), release, mark asleep with backoff.
func (e *Engine) onExit(in *inst, p *proc, status error) {
	if p.stopping.Load() {
		return
	}
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	if in.proc != p || in.state != StateAwake {
		in.mu.Unlock()
		return
	}
	t := &transition{done: make(chan struct{})}
	in.trans = t
	in.setStateLocked(StateSleeping)
	in.disarmIdleLocked()
	in.stopSyncLocked()
	in.proc = nil
	in.crashes++
	n := in.crashes
	why := fmt.Sprint(status)
	if p.oomKills > 0 {
		why = fmt.Sprintf("out of memory: killed by the kernel at the kind's memory limit (%d bytes)", in.kind.Limits.MemoryBytes)
	}
	in.lastCrash = why
	in.mu.Unlock()
	e.c.crashes.Add(1)
	e.emit(Event{Type: EventCrash, Host: in.host, Reason: fmt.Sprint(status)})
	if p.oomKills > 0 {
		e.c.oomKills.Add(1)
	}
	log := in.logger()
	log.Error("instance exited unexpectedly", zap.Int("pid", p.pid), zap.String("status", why),
		zap.Int("consecutive_crashes", n), zap.String("log", in.logPath))

	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 5*time.Minute)
	defer cancel()
	err := e.checkpointAndRelease(ctx, in)

	in.mu.Lock()
	in.trans = nil
	if errors.Is(err, space.ErrFenced) {
		in.setStateLocked(StateFenced)
	} else {
		in.setStateLocked(StateAsleep)
	}
	if b := crashBackoff(n); b > 0 {
		in.retryAt = e.now().Add(b)
		in.retryWhy = "instance crashing"
	}
	close(t.done)
	in.mu.Unlock()
}

// Forget is the removal of a route: the space's latest state is saved first (stop,
// checkpoint, release the lease: a sleep), then its scheduled wake record and its local
// state are deleted; its bucket data stays, so a re-created route finds every write
// acknowledged before the removal. When the checkpoint cannot be made (a bucket error,
// a fenced box) the local state is kept and an error returned: a removal never loses
// writes silently. Discard is the separate choice of dropping unsaved state. Forget
// deletes the wake record even when this engine never ran the space.
func (e *Engine) Forget(ctx context.Context, host string) error {
	in := e.lookup(host)
	if in == nil {
		if validHost(host) {
			e.setWakeRecord(ctx, host, nil)
		}
		return nil
	}
	in.mu.Lock()
	t := in.trans
	in.mu.Unlock()
	if t != nil { // a wake or sleep in flight: let it finish, then save what it left
		select {
		case <-t.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := e.sleep(ctx, in, "removed", false); err != nil {
		return fmt.Errorf("saving the space before removal (local state kept): %w", err)
	}
	if err := e.flushDirty(ctx, in); err != nil {
		return fmt.Errorf("saving the space before removal (local state kept): %w", err)
	}
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	unsaved := in.held || in.dirty
	running := in.state == StateAwake || in.state == StateWaking
	in.mu.Unlock()
	switch {
	case unsaved:
		return errors.New("saving the space before removal: box fenced or checkpoint failed; local state kept and saved once the bucket is reachable")
	case running:
		return errors.New("space woke again during its removal; local state kept")
	}
	return e.dropLocked(ctx, in)
}

// Discard is the explicit choice of dropping a space without saving it: it stops the
// instance, releases its lease, deletes its scheduled wake record and its local state.
// Writes since the last checkpoint are lost; the bucket data stays as it was.
func (e *Engine) Discard(ctx context.Context, host string) error {
	in := e.lookup(host)
	if in == nil {
		if validHost(host) {
			e.setWakeRecord(ctx, host, nil)
		}
		return nil
	}
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	p, kind := in.proc, in.kind
	in.disarmIdleLocked()
	in.stopSyncLocked()
	in.mu.Unlock()
	if p != nil {
		e.stopProcess(in, p, kind)
	}
	in.mu.Lock()
	in.dirty, in.held = false, false
	in.mu.Unlock()
	return e.dropLocked(ctx, in)
}

// dropLocked (in.op held) releases the lease if still held, deletes the scheduled wake
// record and forgets the space's local state.
//
// The inst is marked dropped first and leaves the engine's map last, once its socket and
// state directories are gone: a new inst for the host (a re-created route) is made only
// after that, so nothing of this one's cleanup can remove what the new one made, and an
// Acquire that held this inst waits for the drop and then takes the new one.
func (e *Engine) dropLocked(ctx context.Context, in *inst) error {
	if !e.fenced.Load() {
		e.releaseLease(in)
	}
	e.setWakeRecord(ctx, in.host, nil)
	in.mu.Lock()
	in.dropped = true
	in.proc = nil
	in.setStateLocked(StateAsleep)
	in.mu.Unlock()
	os.RemoveAll(filepath.Dir(in.socket))
	in.unpinSocket()
	in.mu.Lock()
	if in.logw != nil {
		in.logw.Close()
		in.logw = nil
	}
	in.mu.Unlock()
	err := os.RemoveAll(in.dir)
	e.mu.Lock()
	if e.spaces[in.host] == in {
		delete(e.spaces, in.host)
	}
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("removing local state: %v", err)
	}
	return nil
}
