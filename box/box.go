// Package box is what one lchat box does with its routes and spaces, whichever door a
// change comes through: the admin API, the peer API, the console's actions, or the CLI
// (through the admin API). Each door decodes its request, calls one method here and
// encodes the answer; a rule of what a change does (save the space first, sleep a space
// that stopped hibernating, tombstone the row on the peers) is written here once.
//
// It also holds the order a box starts in (Open) and drains in (Drain, Close): those are
// correctness rules, not glue. It has no Caddy glue: modules/lchat provisions a Box from
// its config and serves its endpoints over it.
package box

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/check"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/ledger"
	"github.com/lchat/lchat-caddy/lifecycle"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// Config is what a box is opened with: the parts that outlive a config reload.
type Config struct {
	// Bucket is the object store of the spaces' state. Required.
	Bucket bucket.Bucket
	// StateDir holds the instances' sockets and data directories. Required.
	StateDir string
	// Registry is the path of the route store. Required.
	Registry string
	// TombstoneTTL is how long a deleted host is remembered. Default
	// registry.DefaultTombstoneTTL.
	TombstoneTTL time.Duration
	// DrainTimeout bounds the drain (Drain). Default 60s.
	DrainTimeout time.Duration
	// Holder names this box in leases without the mesh (with it, its SELF does).
	Holder string
	// Engine tunes the engine: kinds, max_awake, wake scans, uids, instance logs. Open
	// sets its bucket, state dir, lease identity, Resolve and, with the mesh, its
	// liveness and fencing hooks.
	Engine engine.Config
	// Mesh is the mesh identity (from the environment); the mesh is off when it is not
	// Enabled.
	Mesh mesh.Config
	// MeshOptions tune the mesh; ignored when it is off.
	MeshOptions MeshOptions
	// Version is this build's version, in heartbeats and status documents.
	Version string
	// Observer, when set, receives every engine event (the metrics' histograms).
	Observer engine.Observer
	// Exiting, when set, is polled: once it reports true (the process is shutting down)
	// the box drains at once, without waiting for Close (see watchExit).
	Exiting func() bool
	// Logger receives the box's logs. Default: a no-op logger.
	Logger *zap.Logger
}

// Box is one running box: its registry, engine and, with the mesh, its membership and
// replication. Its methods are safe for concurrent use.
type Box struct {
	reg *registry.Registry
	// standby is this box's spool and the engine's way to its spaces' standbys; nil
	// without a mesh.
	standby *standbyLink
	watch   *standbyWatch // the holders of the spaces this box stands by for; nil without a mesh
	eng     *engine.Engine
	life    *lifecycle.Machine // the box's lifecycle, which the engine and the membership read
	bucket  *bucket.Counted    // the bucket, counting its requests
	mesh    *Mesh              // nil without the mesh
	logger  *zap.Logger
	cfg     Config
	ids     ledger.Allocators

	// requests counts the requests the lchat handler took (Count); it only grows.
	requests atomic.Uint64

	// extraCounters, when set (SetCounters), adds counters of parts the box does not own
	// (the held connections of modules/lchat) to its status, fleet entry and console.
	extraCounters atomic.Pointer[func() map[string]uint64]
	// spaceConns, when set (SetSpaceConns), reads the held connections by space.
	spaceConns atomic.Pointer[func() map[string]fleetview.Conns]

	// setMu serializes Start and Stop; settings is what they set (the running
	// config's) and prev what the running config replaced, put back by an unwind.
	setMu    sync.Mutex
	settings atomic.Pointer[Settings]
	prev     *Settings

	drainOnce sync.Once
	drainErr  error
	stopWatch chan struct{} // closed by Close: ends the exit watch
	exiting   chan struct{} // closed by the exit watch when the process exits (Exiting)
	closeOnce sync.Once
	closeErr  error
}

// Settings are what one config of the box decides beyond Config: the kinds it runs and
// what route changes use. They are the box's from the config's Start on until another
// config starts, or until Stop unwinds that start and puts back the ones before.
type Settings struct {
	// Kinds are the kinds this config runs; routes are checked against them.
	Kinds map[string]engine.Kind
	// CloudRegion is the home_region of a route created without one (LCHAT_CLOUD_REGION).
	CloudRegion string
	// WildcardDomains are the managed wildcard domains; minted hosts go under the first.
	WildcardDomains []string
	// IDLedger is the shared id ledger's namespace (LCHAT_CLOUD_ID_LEDGER); empty: minted
	// ids come from a counter of this box alone, beside its registry.
	IDLedger string
	// RelocateDNS is the provider `relocate --move-dns` sets records through; nil: none.
	RelocateDNS mesh.DNSSetter
	// RegionBuckets are the buckets of other regions, by region (mesh.region_buckets).
	RegionBuckets map[string]bucket.Bucket
}

// Open starts a box, in this order: the bucket is checked to enforce conditional writes
// (a store that lets two writers win is refused: every lease and manifest swap relies on
// it), the registry is opened (its revisions name this box's SELF, or "local"), the
// engine is made with the mesh's lease identity and liveness, and the mesh is joined with
// the engine fenced until the first heartbeat write succeeds; that first beat runs before
// Open returns, so a healthy box serves from its first request. The engine's loops start
// with the first config (Start).
func Open(cfg Config) (*Box, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 60 * time.Second
	}
	if err := checkBucketAtStart(cfg.Bucket, cfg.Logger); err != nil {
		return nil, err
	}
	counted := bucket.NewCounted(cfg.Bucket)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state_dir: %v", err)
	}
	// Revisions of this box's changes name it by its mesh SELF (registry/version.go).
	origin := cfg.Mesh.Self
	if origin == "" {
		origin = "local"
	}
	reg, err := registry.Open(cfg.Registry, registry.Options{Origin: origin, TombstoneTTL: cfg.TombstoneTTL})
	if err != nil {
		return nil, err
	}
	var inc [8]byte
	rand.Read(inc[:])
	// The box's lifecycle: fenced until the mesh's first heartbeat (its membership moves
	// the fence), or at once serving without a mesh; draining from Drain, closed by Close.
	// The engine reads it and hears its fence.
	life := lifecycle.New()
	if !cfg.Mesh.Enabled() {
		life.Fence(false)
	}
	var ms *Mesh
	if cfg.Mesh.Enabled() {
		if ms, err = newMesh(cfg.Mesh, cfg.MeshOptions, counted, cfg.Version, life, cfg.Logger.Named("mesh")); err != nil {
			reg.Close()
			return nil, err
		}
		ms.catchUp.TombstoneTTL = cfg.TombstoneTTL
	}
	ecfg := cfg.Engine
	ecfg.Bucket = counted
	ecfg.StateDir = cfg.StateDir
	ecfg.Holder = cfg.Holder
	ecfg.Incarnation = hex.EncodeToString(inc[:])
	ecfg.Logger = cfg.Logger.Named("engine")
	ecfg.Lifecycle = life
	ecfg.Resolve = func(host string) (engine.Space, bool) {
		rt, ok := reg.Lookup(host)
		if !ok || !rt.Hibernate || rt.Delegated() {
			return engine.Space{}, false
		}
		return SpaceOf(rt), true
	}
	var sl *standbyLink
	if ms != nil {
		ms.engineConfig(&ecfg, reg)
		if sl, err = newStandbyLink(ms, reg, cfg.StateDir); err != nil {
			reg.Close()
			ms.close()
			return nil, err
		}
		ecfg.Standby = sl
	}
	eng, err := engine.New(ecfg)
	if err != nil {
		reg.Close()
		if ms != nil {
			ms.close()
			sl.spool.Close()
		}
		return nil, fmt.Errorf("starting engine: %v", err)
	}
	if sl != nil {
		sl.spool.HandedOver = eng.Prewarm
		for _, st := range sl.spool.Status() {
			if st.Holder != "" && !st.Sealed {
				eng.Prewarm(st.Host) // the streams kept across a restart
			}
		}
	}
	b := &Box{reg: reg, eng: eng, bucket: counted, mesh: ms, standby: sl, life: life, logger: cfg.Logger, cfg: cfg,
		stopWatch: make(chan struct{}), exiting: make(chan struct{})}
	b.settings.Store(&Settings{Kinds: cfg.Engine.Kinds})
	if sl != nil {
		// Before a peer can send to the spool: this box warms the spaces it stands by for,
		// and watches a new holder at once (its segments come over a stream that lasts, so
		// the kick of each request's end would come late: MeshAPI).
		sl.spool.Started = func(host string, _ int64) {
			eng.Prewarm(host)
			b.KickStandbyWatch()
		}
	}
	if ms != nil {
		// Seeded before it announces itself: once peers see its heartbeat they place
		// spaces here and forward their requests, and a balancer sends it clients.
		b.seedOnJoin()
		if err := ms.start(eng, reg); err != nil {
			eng.Close()
			ms.close()
			reg.Close()
			return nil, fmt.Errorf("starting mesh membership: %v", err)
		}
		b.startStandbyWatch()
		cfg.Logger.Info("mesh on", zap.Stringer("mesh", ms.cfg), zap.Duration("beat", ms.m.Config().Beat),
			zap.Duration("dead_after", ms.m.Config().DeadAfter), zap.Bool("fenced", ms.m.Fenced()))
	}
	cfg.Logger.Info("lchat registry and engine ready",
		zap.String("registry", cfg.Registry), zap.Int("routes", reg.Len()),
		zap.String("bucket", counted.String()), zap.String("state_dir", cfg.StateDir))
	if cfg.Observer != nil {
		eng.Observe(cfg.Observer)
	}
	b.watchExit()
	return b, nil
}

// checkBucketAtStart races a few conditional writes on the bucket before the box serves
// (bucket/check.AtStart) and refuses a store that lets two writers win. A check that
// cannot run (the store unreachable at start) is logged, not fatal: leases fail closed
// meanwhile.
func checkBucketAtStart(bkt bucket.Bucket, logger *zap.Logger) error {
	// Bounded: a store that does not answer must not hold the whole server's start.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := check.AtStart(ctx, bkt)
	switch {
	case errors.Is(err, check.ErrIgnoresConditions):
		return fmt.Errorf("bucket %s: %v; refusing to start: leases and checkpoints are not safe on it", bkt, err)
	case err != nil:
		logger.Warn("could not verify that the bucket enforces conditional writes; starting anyway", zap.String("bucket", bkt.String()), zap.Error(err))
	default:
		logger.Info("bucket enforces conditional writes", zap.String("bucket", bkt.String()), zap.Duration("took", time.Since(start)))
	}
	return nil
}

// Start makes s the box's settings (the kinds the engine runs first: a config whose
// kinds the engine refuses does not start) and starts the engine's background loops
// (idempotent across reloads).
func (b *Box) Start(s *Settings) error {
	b.setMu.Lock()
	defer b.setMu.Unlock()
	if err := b.eng.SetKinds(s.Kinds); err != nil {
		return fmt.Errorf("kinds: %v", err)
	}
	b.prev = b.settings.Swap(s)
	b.eng.Start()
	return nil
}

// Stop is the stop of the config whose settings are s. When s is still the box's
// settings, its config's start is being unwound (another app failed to start, so the
// running config stays): the settings before it are put back, and Stop reports that it
// unwound. When s is the settings a newer config replaced, that replacement is final:
// nothing is put back later. Otherwise nothing changes.
func (b *Box) Stop(s *Settings) (unwound bool, err error) {
	b.setMu.Lock()
	defer b.setMu.Unlock()
	switch {
	case b.settings.Load() == s && b.prev != nil:
		if err := b.eng.SetKinds(b.prev.Kinds); err != nil {
			return false, fmt.Errorf("restoring kinds: %v", err)
		}
		b.settings.Store(b.prev)
		b.prev = nil
		return true, nil
	case b.prev == s:
		b.prev = nil
	}
	return false, nil
}

// Settings returns the settings in effect.
func (b *Box) Settings() *Settings { return b.settings.Load() }

// exitPoll is how often the exit watch asks Config.Exiting.
const exitPoll = 50 * time.Millisecond

// watchExit drains the box as soon as the process is exiting. The server that holds the
// box stops its request handling before it lets go of the box (Close), and waits for open
// requests: one open SSE stream or WebSocket to a space, which ends only when the space's
// instance stops, that is, in the drain, would hold the whole shutdown before the drain
// could start. So the drain does not wait: the spaces are drained (heartbeat marked
// draining, every instance stopped, checkpointed and its lease released), their streams
// end with their instances, the servers' shutdown finishes on its own, and the whole stop
// takes the drain's time, bounded by DrainTimeout. A config reload never exits.
func (b *Box) watchExit() {
	if b.cfg.Exiting == nil {
		return
	}
	stop := b.stopWatch
	safego.Go(nil, b.logger, "exit watch", func() {
		t := time.NewTicker(exitPoll)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if b.cfg.Exiting() {
					b.logger.Info("process exiting: draining spaces now, before the servers finish shutting down")
					close(b.exiting)
					b.Drain()
					return
				}
			}
		}
	})
}

// Exiting is closed once the process is exiting (Config.Exiting), before the drain
// starts: the one watch of the process's exit, for the parts that end with it (the held
// connections close with 1012 so their clients reconnect to another box). It is never
// closed by a reload, nor by Close alone.
func (b *Box) Exiting() <-chan struct{} { return b.exiting }

// Drain is the first part of a real shutdown, run once whoever asks first: the heartbeat
// is rewritten as draining (peers stop placing spaces here at their next listing, yet this
// box stays live, so the lease of a space it is still checkpointing cannot be taken over
// and the takeover's writes lost to this box's final checkpoint), then every awake space
// is stopped, checkpointed and its lease released (which frees it at once), within
// DrainTimeout.
func (b *Box) Drain() error {
	b.drainOnce.Do(func() {
		b.life.Drain()
		if b.mesh != nil {
			b.mesh.markDraining()
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DrainTimeout)
		defer cancel()
		b.drainErr = b.eng.Drain(ctx)
		if b.drainErr != nil {
			b.logger.Warn("drain", zap.Error(b.drainErr))
		}
	})
	return b.drainErr
}

// Close drains the box (Drain; already under way, or done, on a process exit), closes the
// engine, and only then leaves the mesh (the heartbeat deleted: every drain write has
// returned, so peers may count this box gone) and closes the registry. Idempotent.
func (b *Box) Close() error {
	b.closeOnce.Do(func() {
		start := time.Now()
		close(b.stopWatch)
		err := b.Drain()
		b.eng.Close()
		if b.mesh != nil {
			b.standby.release(b.logger)
			b.mesh.leave()
			b.mesh.close()
			b.standby.spool.Close()
			b.standby.client.Close() // the streams to this box's standbys
		}
		if cerr := b.reg.Close(); err == nil {
			err = cerr
		}
		b.life.Close()
		if err != nil {
			b.logger.Error("draining spaces", zap.Error(err), zap.Duration("took", time.Since(start)))
			b.closeErr = fmt.Errorf("draining spaces: %v", err)
			return
		}
		b.logger.Info("drained spaces", zap.Duration("took", time.Since(start)))
	})
	return b.closeErr
}

// Registry is the box's route store.
func (b *Box) Registry() *registry.Registry { return b.reg }

// Engine is the box's hibernation engine.
func (b *Box) Engine() *engine.Engine { return b.eng }

// Bucket is the box's bucket (counting its requests).
func (b *Box) Bucket() bucket.Bucket { return b.bucket }

// Mesh is the box's mesh; nil when the mesh is off.
func (b *Box) Mesh() *Mesh { return b.mesh }

// Count counts one request taken by the lchat handler (Stats.Requests).
func (b *Box) Count() { b.requests.Add(1) }

// Self names this box: its SELF with the mesh, else "local".
func (b *Box) Self() string {
	if b.mesh != nil {
		return b.mesh.cfg.Self
	}
	return "local"
}

// SpaceOf is the space the engine runs for a hibernating route.
func SpaceOf(rt *registry.Route) engine.Space {
	return engine.Space{Host: rt.Host, Kind: rt.Kind, Version: rt.Version, Env: rt.Env}
}

// checkRoute refuses a route this box's settings cannot serve (engine.CheckRoute).
func (b *Box) checkRoute(rt *registry.Route) error {
	return engine.CheckRoute(b.settings.Load().Kinds, rt)
}
