package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/DeRuina/timberjack"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/spacestore"

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

	// op serializes the operations that touch the process and the bucket (wake, stop,
	// checkpoint, drop); it is held across I/O. Lock order: op before mu. Helpers that
	// need op held end in OpHeld; those that need mu held end in Locked.
	op     sync.Mutex
	syncer *spacestore.Syncer // guarded by op

	// The standby copy (prewarm.go): warmAsked counts the Prewarm calls, warming is set
	// while a warming runs, warmGen is 1 + the generation warmed (0: none, or consumed
	// by a wake).
	warmAsked atomic.Uint64
	warmGen   atomic.Int64
	warming   atomic.Bool
	// lastWakeKept: the last wake here downloaded nothing (it kept the data dir: this
	// box's own state or its standby copy).
	lastWakeKept atomic.Bool

	// here mirrors state for lock-free readers (Engine.Here): true while waking or
	// awake. Written only by setStateLocked, with mu held.
	here atomic.Bool
	// dur is the log and output gate of an awake space whose kind ships a log
	// (durable.go), read lock-free on the request path (Use.Gate): set by the wake,
	// taken away by the stop; nil otherwise.
	dur atomic.Pointer[durable]

	mu      sync.Mutex
	sp      Space
	kind    Kind
	state   State // written only by setStateLocked (state.go)
	since   time.Time
	uses    int    // Uses held in the current awake period
	gen     uint64 // awake period; a Use from an earlier one no longer counts
	waiters int    // Acquires waiting on trans
	// changed is closed, and cleared, at the next change of uses, waiters or state
	// (changedLocked): what a wait for the space to settle (quiesce) selects on. nil
	// while nobody waits, so the request path makes no channel.
	changed chan struct{}
	// draining is set while a drain is about to put this running space to sleep: no new
	// Use is given out (ErrDraining sends the request to the box that takes the space
	// over), while those already given out finish. Written only by drainLocked and
	// setStateLocked (state.go), which ends it when the process is gone.
	draining bool
	lastUsed time.Time // LRU order, and the idle clock: set by every Acquire and Release
	// trans is the wake or stop in flight: non-nil exactly while waking or sleeping.
	// Written only by setStateLocked.
	trans     *transition
	proc      *proc
	leaseETag string // "" when this box does not hold the lease
	// goneHolder is the lease holder (holder and incarnation) a TakeOver found dead before
	// its heartbeat says so: the next wake's lease counts it dead (standby.go). One try.
	goneHolder [2]string
	// releasedETag is the ETag of the lease as this box last released it (""
	// unknown): the next wake takes it with one write while nobody wrote it since
	// (spacestore.AcquireLeaseAfter).
	releasedETag string
	// unreachableGen is the awake period last reported unreachable (Use.Unreachable), so
	// a period's many failing requests put it to sleep once.
	unreachableGen uint64
	idle           *time.Timer // one per awake period; re-arms itself while the space is used
	idleGen        uint64
	syncStop       context.CancelFunc
	crashes        int // consecutive, the count crashBackoff follows; reset by a sleep
	wakeFails      int // consecutive failed wakes, the count failedWakeBackoff follows
	// retry is when the next wake may start, and why not before: the backoff of a space
	// that does not run (asleep, failed, fenced or unsaved alike). Written only by
	// retryLaterLocked (state.go).
	retry       retryHold
	lastSync    time.Time
	lastSyncErr string
	size        int64 // bytes of the files in the manifest last read or written here
	lastCrash   string
	logw        *timberjack.Logger // instance.log, capped and rotated; created by the first start
}

// transition is one wake or stop in flight; waiters block on done. setStateLocked makes it
// as the space moves to waking or sleeping and closes done as it moves on.
type transition struct {
	done chan struct{}
	err  error // a wake's error, set before the move that closes done
	// from is the state a wake started from (StateUnsaved: the local state may be the
	// newest).
	from State
	// admitted: a wake counted under MaxAwake (capacity.go). Guarded by the inst's mu.
	admitted bool
	// ticket is a wake's place in the order of first requests (startGate).
	ticket uint64
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
		in.changedLocked()
	}
	in.lastUsed = now
	in.mu.Unlock()
}

// changedLocked tells whoever waits for the space's uses, waiters or state to change
// that they did (in.mu held). Nothing is done when nobody waits.
func (in *inst) changedLocked() {
	if in.changed != nil {
		close(in.changed)
		in.changed = nil
	}
}

// changesLocked returns a channel closed at the next change of the space's uses, waiters
// or state (in.mu held).
func (in *inst) changesLocked() <-chan struct{} {
	if in.changed == nil {
		in.changed = make(chan struct{})
	}
	return in.changed
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
	if u.gen != in.gen || in.state != StateAwake || in.unreachableGen == u.gen {
		in.mu.Unlock()
		return
	}
	in.unreachableGen = u.gen
	in.mu.Unlock()
	in.logger().Warn("instance unreachable on its socket; putting the space to sleep so the next request wakes it again")
	safego.Go(&e.wg, e.log, "sleep unreachable", func() {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := e.sleep(ctx, in, "unreachable"); err != nil {
			in.logger().Warn("sleeping an unreachable instance", zap.Error(err))
		}
	})
}
