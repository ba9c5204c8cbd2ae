// Package engine is the hibernation engine: it wakes spaces on demand (lease → restore →
// start → readiness), keeps them in sync with the bucket per their replication class, puts
// them to sleep when idle (stop → checkpoint → release), recovers crashed instances with
// backoff, fences itself out on a lost manifest swap or a lost heartbeat, and fires
// scheduled wakes. It has no Caddy glue; the lchat app and handler drive it.
package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/sandbox"
	"github.com/lchat/lchat-caddy/spacestore"

	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/lifecycle"
)

// ReplicationClass is when an awake space's state is copied to the bucket
// (Replication.Class).
type ReplicationClass string

// Replication classes.
const (
	// ReplicateSleep checkpoints only at sleep.
	ReplicateSleep ReplicationClass = "sleep"
	// ReplicatePeriodic checkpoints every Replication.Interval.
	ReplicatePeriodic ReplicationClass = "periodic"
	// ReplicateContinuous checkpoints within about a second of a change (debounced).
	ReplicateContinuous ReplicationClass = "continuous"
)

// Durability is what a write a space's instance answered for survives (Kind.Durability).
type Durability string

// Durabilities.
const (
	// DurabilityCheckpoint: a write survives once a checkpoint holds it; a box's death
	// takes what its replication class bounds (up to a periodic interval). The opt-out.
	DurabilityCheckpoint Durability = "checkpoint"
	// DurabilityBucket: every answer of the instance waits until the SQLite commits made
	// before it are in the space's log in the bucket (durable.go): a write the box
	// acknowledged survives the death of its box, its disk included. The default on a box
	// with no mesh.
	DurabilityBucket Durability = "bucket"
	// DurabilityStandby: every answer waits until the commits made before it are on the
	// disk of the space's standby box as well (standby.go), or, with no standby, in the
	// bucket log: a write the box acknowledged survives the death of its box. The default
	// on a box of a mesh.
	DurabilityStandby Durability = "standby"
)

// Replication is how often an awake space's state is copied to the bucket.
type Replication struct {
	// Class is ReplicateSleep, ReplicatePeriodic or ReplicateContinuous. Default
	// ReplicatePeriodic.
	Class ReplicationClass
	// Interval of the periodic class. Default 60s.
	Interval time.Duration
}

// Kind is how this box runs one kind of space. It always comes from this box's own config,
// never from a replicated route.
type Kind struct {
	Name    string
	Command string // absolute path or a name looked up in PATH
	Args    []string
	// Env is extra environment from this box's config.
	Env map[string]string
	// AllowedEnv names the route env variables this kind accepts; loader and shell variables
	// (PATH, LD_*, DYLD_*, BASH_ENV, ...) are refused regardless.
	AllowedEnv []string
	// IdleTimeout puts a space to sleep after this long without a Use. Default 10m.
	IdleTimeout time.Duration
	// StopSignal asks the instance to stop. Default SIGTERM.
	StopSignal syscall.Signal
	// StopGrace is how long a stop waits before SIGKILL. Default 10s.
	StopGrace time.Duration
	// ReadyPath, when set, must answer a GET over the socket with 2xx; empty means the
	// socket accepting a connection is ready.
	ReadyPath string
	// ReadyTimeout bounds the wait for readiness. Default 30s.
	ReadyTimeout time.Duration
	// Replication defaults to periodic, 60s.
	Replication Replication
	// Durability is DurabilityBucket (default) or DurabilityCheckpoint.
	Durability Durability
	// WakePath is the POST target of scheduled wakes. Default "/".
	WakePath string
	// Retention is how long checkpoints stay restorable. Default spacestore.DefaultRetention.
	Retention time.Duration
	// GCGrace is how young an unreferenced object must be to survive a collection (an
	// upload, restore or relocate copy in flight). Default spacestore.DefaultGCGrace.
	GCGrace time.Duration
	// Isolation is IsolationAuto (default), IsolationOn or IsolationNone (isolate.go).
	Isolation Isolation
	// Network is NetworkAuto (default), NetworkNone, NetworkEgress or NetworkHost
	// (network.go).
	Network Network
	// NetworkAllow are the ranges an egress kind's instances may reach after all
	// (ParseAllow). Default none.
	NetworkAllow []netip.Prefix
	// Limits bound each instance of this kind; zero fields are unlimited.
	Limits Limits
	// Tmp is TmpAuto (default), TmpPrivate or TmpHost: whether instances get a /tmp of
	// their own (disk.go).
	Tmp Tmp
	// SocketActivation has the box bind and listen on the space's socket and pass it to
	// the instance as fd 3 (LISTEN_FDS=1, LISTEN_FDNAMES=http, LISTEN_PID=1: the instance
	// is pid 1 of its own PID namespace), so a wake proxies the first request at once
	// (activation.go). Default false: the instance binds $LCHAT_SOCKET itself.
	SocketActivation bool
}

// Space is one route the engine is asked to serve.
type Space struct {
	Host, Kind, Version string
	// Env is the route's own env (secrets): passed to the instance, never logged.
	Env map[string]string
}

// Config configures an Engine.
type Config struct {
	Bucket bucket.Bucket
	// StateDir holds sockets, data dirs and logs, derived per host.
	StateDir string
	// Holder is this box's identity in leases.
	Holder string
	// Incarnation is new each process start.
	Incarnation string
	Kinds       map[string]Kind
	// MaxAwake caps awake spaces; the least recently used idle one sleeps first, and a
	// wake is refused (503) when every awake space is in use (capacity.go). 0 = unlimited.
	MaxAwake int
	// HolderLive reports whether a lease holder is alive; nil = single box: only this box's
	// own current incarnation counts as live.
	HolderLive func(holder, incarnation string) bool
	// WakeScanInterval is the scheduled-wake LIST interval. Default 30s.
	WakeScanInterval time.Duration
	// Owns reports whether this box fires host's due scheduled wake, late past its due
	// time (a mesh: mesh.Node.FiresWake); nil = all.
	Owns func(host string, late time.Duration) bool
	// Resolve maps a host with a due scheduled wake to its route; not found means the host
	// has no route (its record is deleted when this box owns the host). nil falls back to
	// the last Space this engine was asked to serve under that host.
	Resolve func(host string) (Space, bool)
	// Fresh, when set, is asked before every use of a space: false means this box's
	// heartbeat is past its fence time though the fence has not run yet (the box was
	// paused), and the request gets a retry, as when fenced. nil: always fresh.
	Fresh func() bool
	// FenceStopGrace caps a kind's StopGrace when a heartbeat fence stops the awake
	// instances: they must be gone before peers count this box dead and take over.
	// Zero: each kind's StopGrace.
	FenceStopGrace time.Duration
	// UIDFirst and UIDCount are the range isolated spaces get their uid and gid from.
	// Default sandbox.DefaultUIDFirst (3000000) and sandbox.DefaultUIDCount (65536).
	UIDFirst, UIDCount uint32
	// PageReader is the lchat-pageread binary that reads an isolated space's SQLite
	// databases for its checkpoints, under the space's uid (pageread.go, docs/parsers.md).
	// Default $LCHAT_PAGEREAD, else lchat-pageread beside this process's executable.
	PageReader string
	// PageReadTimeout bounds each answer of lchat-pageread (an open, a scan, a batch of
	// pages; not the uploads between them); the helper is killed at it and the checkpoint
	// fails. Default spacestore.DefaultPageReadTimeout.
	PageReadTimeout time.Duration
	// LogMaxMB caps each space's instance.log, in MiB, before it rotates. Default 10.
	LogMaxMB int
	// LogBackups is how many rotated instance logs each space keeps. Default 2.
	LogBackups int
	// MaxStarting caps the instances starting at once (from the exec to the first
	// answer), admitted in the order of their first requests (startgate.go). Default
	// twice the CPUs this process may use.
	MaxStarting int
	// LeaseBeforeStart has every wake hold its lease before it restores the data dir and
	// starts the instance. Default false: the lease is written while they run and held
	// before anything is proxied (wakelease.go); the figures (tests/wake) set it to
	// measure the difference side by side.
	LeaseBeforeStart bool
	// Now is the engine's clock: every time the engine reads (a state's since, the last
	// use, the backoffs, the start gate's holds, checkpoint and lease times, events) is
	// Now's. Default time.Now. The engine's waits use the runtime's timers: a test drives
	// both with testing/synctest, or sets Now to read a clock of its own.
	Now func() time.Time
	// Lifecycle is the box's lifecycle, which the engine reads for whether it is fenced
	// (it serves and writes no space) and draining (it wakes none), and whose fence moves
	// it hears (SetFenced's actions). Default: its own, serving.
	Lifecycle *lifecycle.Machine
	// Standby reaches the standbys of spaces whose kind's durability is standby
	// (standby.go). nil: such a space acknowledges on bucket proofs.
	Standby StandbyLink
	Logger  *zap.Logger
}

// errFencedNoWrite is why a fenced box writes nothing.
var errFencedNoWrite = errors.New("box fenced: not writing")

// ErrDraining means the box is shutting down: it serves the spaces still awake on it
// and wakes none (the space is asleep here, or was just put to sleep by the drain).
var ErrDraining = &RetryError{After: 5 * time.Second, Reason: "box shutting down"}

// ErrUnknownKind means the space's kind is not configured on this box.
var ErrUnknownKind = errors.New("unknown kind")

// LeaseHeldError means a live other box holds the space's lease.
type LeaseHeldError struct {
	Holder string
}

func (e *LeaseHeldError) Error() string { return "space is held by " + e.Holder }

// RetryError means the space cannot be served now; try again after After (503 + Retry-After).
type RetryError struct {
	After  time.Duration
	Reason string
	// Err is the cause, for errors.Is; Error says Reason only (it reaches clients).
	Err error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("space unavailable (%s), retry after %s", e.Reason, e.After)
}

func (e *RetryError) Unwrap() error { return e.Err }

// SpaceStatus is one space as Status reports it.
type SpaceStatus struct {
	Host          string    `json:"host"`
	Kind          string    `json:"kind"`
	State         State     `json:"state"`
	Since         time.Time `json:"since"`
	PID           int       `json:"pid,omitempty"`
	LastSync      time.Time `json:"last_sync,omitzero"`
	LastSyncError string    `json:"last_sync_error,omitempty"`
	// Size is the bytes of the space's files as of its last wake or checkpoint here.
	Size int64 `json:"size,omitempty"`
	// LastCrash says why the instance last ended on its own ("out of memory ...").
	LastCrash string `json:"last_crash,omitempty"`
	// Durability is the space's kind's (Kind.Durability).
	Durability Durability `json:"durability,omitempty"`
	// Log is the log and output gate of an awake space whose kind ships one.
	Log *DurableStatus `json:"log,omitempty"`
	// WarmGeneration, for a space asleep here: the generation of its checkpoint this box
	// keeps in place as its standby (Prewarm): a wake here downloads none while that is
	// the bucket's checkpoint. Nil when none.
	WarmGeneration *int64 `json:"warm_generation,omitempty"`
	// KeptDataDir: awake here from a wake that downloaded no checkpoint (this box's own
	// copy from its last sleep, or its warm standby copy).
	KeptDataDir bool `json:"kept_data_dir,omitempty"`
}

// Counters are totals since the engine was created.
type Counters struct {
	Wakes          uint64 `json:"wakes"`
	Sleeps         uint64 `json:"sleeps"`
	Crashes        uint64 `json:"crashes"`
	LeaseConflicts uint64 `json:"lease_conflicts"`
	Fenced         uint64 `json:"fenced"`
	Syncs          uint64 `json:"syncs"`
	BlobsUploaded  uint64 `json:"blobs_uploaded"`
	BytesUploaded  uint64 `json:"bytes_uploaded"`
	OOMKills       uint64 `json:"oom_kills"`
	// WakeFailures counts failed wakes, each of which starts or extends its space's
	// backoff; CapRefusals counts wakes refused because every awake space was in use.
	WakeFailures uint64 `json:"wake_failures"`
	CapRefusals  uint64 `json:"cap_refusals"`
	// SkippedFiles counts files left out of checkpoints (and next-wake files not read)
	// because they are not regular files: FIFOs, sockets, devices, symlinks.
	SkippedFiles uint64 `json:"skipped_files"`
}

type counters struct {
	wakes, sleeps, crashes, leaseConflicts, fenced, syncs, blobsUploaded, bytesUploaded, oomKills atomic.Uint64
	skippedFiles, wakeFailures, capRefusals                                                       atomic.Uint64
}

// Engine runs the spaces of one box. Its methods are safe for concurrent use.
type Engine struct {
	cfg    Config
	log    *zap.Logger
	holder spacestore.Holder
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // background loops and per-space goroutines that end on ctx
	start  sync.Once
	close  sync.Once
	c      counters
	obs    observers

	kinds atomic.Pointer[map[string]Kind] // written by New and SetKinds only
	// life is the box's lifecycle: fenced and draining are read from it, never kept here.
	life *lifecycle.Machine

	mu     sync.Mutex
	spaces map[string]*inst

	capMu sync.Mutex // serializes admissions under MaxAwake (capacity.go)

	wakeSeq atomic.Uint64 // tickets of wakes, in the order of their first requests
	gate    startGate

	wakeMu            sync.Mutex
	wakeSlots         map[string]*wakeSlot // by host; see setWakeRecord
	wakeRecordBackoff backoff.Curve        // of a failed wake record write: the package's, or a test's

	uidMu sync.Mutex
	uids  *sandbox.UIDs // opened by uidAlloc on the first isolated wake

	// netMu guards the egress filter (network.go), installed by the first kind set that
	// needs it and removed by Close, and the mesh peers' addresses it refuses.
	netMu sync.Mutex
	fw    *sandbox.Firewall
	fwErr error        // why the filter could not be installed, until the next kind set
	peers []netip.Addr // from SetNetworkPeers

	// diskMu guards the spaces' disk images (disk.go), opened by the first wake of a kind
	// with limits.disk and closed by Close.
	diskMu sync.Mutex
	disks  *sandbox.Disks
	// tmpHidden caches hiddenByPrivateTmp by command: error, or nil.
	tmpHidden sync.Map
	// standby is the totals of the streams and takeovers (standbystats.go).
	standby standbyTotals
	// absent is when this box first found each standby it waits for without a heartbeat
	// (standbyGone).
	absent absentStandbys
}

// New validates cfg, applies defaults and returns an engine. Call Start for the background
// loops.
func New(cfg Config) (*Engine, error) {
	if cfg.Bucket == nil {
		return nil, errors.New("engine: no bucket")
	}
	if cfg.StateDir == "" || cfg.Holder == "" || cfg.Incarnation == "" {
		return nil, errors.New("engine: state dir, holder and incarnation are required")
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = abs
	if len(socketPath(abs, "x")) > 100 {
		return nil, fmt.Errorf("engine: state dir %s too long for Unix socket paths", abs)
	}
	if cfg.WakeScanInterval <= 0 {
		cfg.WakeScanInterval = 30 * time.Second
	}
	if cfg.LogMaxMB <= 0 {
		cfg.LogMaxMB = 10
	}
	if cfg.LogBackups <= 0 {
		cfg.LogBackups = 2
	}
	if cfg.MaxStarting <= 0 {
		cfg.MaxStarting = 2 * runtime.GOMAXPROCS(0)
	}
	cfg.PageReader = pageReaderPath(cfg.PageReader)
	kinds, err := kindsWithDefaults(cfg.Kinds, cfg.Standby != nil)
	if err != nil {
		return nil, err
	}
	cfg.Kinds = nil // read through e.kinds, which SetKinds may replace
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Lifecycle == nil {
		cfg.Lifecycle = lifecycle.New()
		cfg.Lifecycle.Fence(false) // a box of its own, without a mesh: serving
	}
	e := &Engine{
		life:   cfg.Lifecycle,
		cfg:    cfg,
		log:    cfg.Logger,
		holder: spacestore.Holder{ID: cfg.Holder, Incarnation: cfg.Incarnation, Live: cfg.HolderLive},
		spaces: make(map[string]*inst),

		wakeSlots:         make(map[string]*wakeSlot),
		wakeRecordBackoff: wakeRecordBackoff,
		gate:              startGate{n: cfg.MaxStarting, now: cfg.Now},
	}
	e.holder.OnTakeover = func(host string, prev spacestore.Lease) {
		e.log.Warn("took over the lease of a holder that was not live", zap.String("host", host),
			zap.String("holder", prev.Holder), zap.String("incarnation", prev.Incarnation), zap.Time("acquired_at", prev.AcquiredAt))
	}
	if err := e.checkKindsHere(kinds); err != nil {
		return nil, err
	}
	e.logIsolation(kinds)
	e.kinds.Store(&kinds)
	e.tidyDisks()
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.life.OnFence(e.fenceMoved)
	return e, nil
}

// Start launches the background loops (scheduled wakes; per-space sync and idle timers run
// from each wake). Idempotent.
func (e *Engine) Start() {
	e.start.Do(func() {
		safego.Go(&e.wg, e.log, "scheduled wakes", e.scanLoop)
	})
}

// Close stops the loops. It does not sleep spaces (Drain does). Idempotent.
func (e *Engine) Close() {
	e.close.Do(func() {
		e.cancel()
		e.mu.Lock()
		for _, in := range e.spaces {
			in.mu.Lock()
			in.disarmIdleLocked()
			in.mu.Unlock()
		}
		e.mu.Unlock()
	})
	e.wg.Wait()
	e.closeFirewall()
	e.closeDisks()
	if cgroupsOpened.Load() {
		if cg, err := hostCgroups(); err == nil {
			cg.Close() // only empty groups go: other engines of this process keep theirs
		}
	}
}

// now reads the engine's clock (Config.Now).
func (e *Engine) now() time.Time { return e.cfg.Now() }

// Status reports every space this engine knows, sorted by host.
func (e *Engine) Status() []SpaceStatus {
	all := e.all()
	out := make([]SpaceStatus, 0, len(all))
	for _, in := range all {
		in.mu.Lock()
		st := SpaceStatus{Host: in.host, Kind: in.sp.Kind, State: in.state, Since: in.since, LastSync: in.lastSync, LastSyncError: in.lastSyncErr,
			Size: in.size, LastCrash: in.lastCrash, Durability: in.kind.Durability}
		if g := in.warmGen.Load(); g > 0 && in.state == StateAsleep {
			g--
			st.WarmGeneration = &g
		}
		st.KeptDataDir = in.state == StateAwake && in.lastWakeKept.Load()
		if in.proc != nil {
			st.PID = in.proc.pid
		}
		d := in.dur.Load()
		in.mu.Unlock()
		if d != nil {
			st.Log = d.status()
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// Here reports whether host's space is here: waking or awake on this box (a space stays
// where it is awake until it sleeps). It is meant for the request path: one map lookup
// under the engine's lock and an atomic read, no allocation (Status copies every space).
func (e *Engine) Here(host string) bool {
	e.mu.Lock()
	in := e.spaces[host]
	e.mu.Unlock()
	return in != nil && in.here.Load()
}

// Counters reports the totals.
func (e *Engine) Counters() Counters {
	return Counters{
		Wakes:          e.c.wakes.Load(),
		Sleeps:         e.c.sleeps.Load(),
		Crashes:        e.c.crashes.Load(),
		LeaseConflicts: e.c.leaseConflicts.Load(),
		Fenced:         e.c.fenced.Load(),
		Syncs:          e.c.syncs.Load(),
		BlobsUploaded:  e.c.blobsUploaded.Load(),
		BytesUploaded:  e.c.bytesUploaded.Load(),
		OOMKills:       e.c.oomKills.Load(),
		SkippedFiles:   e.c.skippedFiles.Load(),
		WakeFailures:   e.c.wakeFailures.Load(),
		CapRefusals:    e.c.capRefusals.Load(),
	}
}

// get returns the space of host, creating it asleep.
func (e *Engine) get(host string) *inst {
	e.mu.Lock()
	defer e.mu.Unlock()
	in := e.spaces[host]
	if in == nil {
		in = newInst(e, host)
		e.spaces[host] = in
	}
	return in
}

func (e *Engine) lookup(host string) *inst {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.spaces[host]
}

func (e *Engine) all() []*inst {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*inst, 0, len(e.spaces))
	for _, in := range e.spaces {
		out = append(out, in)
	}
	return out
}

// validHost guards the paths derived from a host.
func validHost(h string) bool {
	if h == "" || h == "." || h == ".." || len(h) > 253 {
		return false
	}
	return !strings.ContainsAny(h, "/\\\x00") && !strings.HasPrefix(h, ".")
}

// kindsWithDefaults checks the kinds and fills in their defaults; a kind that names no
// durability gets standby on a box of a mesh (withStandby: its spaces acknowledge on bucket
// proofs while the mesh has no other box for them), bucket elsewhere.
func kindsWithDefaults(in map[string]Kind, withStandby bool) (map[string]Kind, error) {
	kinds := make(map[string]Kind, len(in))
	for name, k := range in {
		if k.Durability == "" && withStandby {
			k.Durability = DurabilityStandby
		}
		k, err := k.withDefaults(name)
		if err != nil {
			return nil, fmt.Errorf("engine: kind %s: %v", name, err)
		}
		if err := checkIsolation(k); err != nil {
			return nil, fmt.Errorf("engine: kind %s: %v", name, err)
		}
		kinds[name] = k
	}
	return kinds, nil
}

// kind returns the configured kind by name.
func (e *Engine) kind(name string) (Kind, bool) {
	k, ok := (*e.kinds.Load())[name]
	return k, ok
}

// Kinds returns the configured kinds, defaults applied. The map is shared: do not modify it.
func (e *Engine) Kinds() map[string]Kind { return *e.kinds.Load() }

// CheckKinds reports whether SetKinds would accept kinds, changing nothing: a config
// checks its kinds while it provisions and applies them only once it starts.
func CheckKinds(kinds map[string]Kind) error {
	_, err := kindsWithDefaults(kinds, false)
	return err
}

// SetKinds replaces the kinds, for a config reload. Awake instances keep the kind they
// were started with until they sleep; the next wake uses the new one. An invalid kind
// leaves the current set in place.
func (e *Engine) SetKinds(kinds map[string]Kind) error {
	k, err := kindsWithDefaults(kinds, e.cfg.Standby != nil)
	if err != nil {
		return err
	}
	if err := e.checkKindsHere(k); err != nil {
		return err
	}
	e.logIsolation(k)
	e.kinds.Store(&k)
	return nil
}

// Interface guards
var (
	_ error = (*LeaseHeldError)(nil)
	_ error = (*RetryError)(nil)
)
