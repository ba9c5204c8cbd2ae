// Package lchat is the Caddy glue of lchat-caddy on one box: the `lchat` app (registry,
// bucket, hibernation engine), the `http.handlers.lchat` handler, the `admin.api.lchat`
// endpoints and the CLI subcommands that call them.
package lchat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/check"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/ledger"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the `lchat` app: the routes of this box, the bucket their state lives in, and
// the hibernation engine that wakes and sleeps them. The registry and the engine
// outlive config reloads (they are held in a usage pool keyed by the registry path),
// so a reload keeps every awake instance and its lease; only the last config letting
// go of them (process exit, or a config without this app) drains the spaces.
type App struct {
	// BucketRaw is the object store for space state. Default: a file bucket in
	// Caddy's data directory (`lchat/bucket`).
	BucketRaw json.RawMessage `json:"bucket,omitempty" caddy:"namespace=lchat.buckets inline_key=backend"`

	// StateDir holds the instances' sockets and data directories. Default: Caddy's
	// data directory, `lchat/state`.
	StateDir string `json:"state_dir,omitempty"`

	// Registry is the path of the route store. Default: Caddy's data directory,
	// `lchat/registry.db`.
	Registry string `json:"registry,omitempty"`

	// Kinds maps a kind name to how this box runs spaces of that kind.
	Kinds map[string]*Kind `json:"kinds,omitempty"`

	// UIDRange is where isolated spaces get their uid (and the gid of the same number),
	// one per host, kept across restarts. Default first 3000000, count 65536. Read
	// when the process starts; a reload keeps the range in use.
	UIDRange *UIDRange `json:"uid_range,omitempty"`

	// InstanceLog caps and rotates each space's instance.log. Default 10 MiB, 2 old
	// files kept. Read when the process starts.
	InstanceLog *InstanceLog `json:"instance_log,omitempty"`

	// MaxAwake caps the awake spaces on this box; the least recently used sleeps
	// first. Default 0: unlimited.
	MaxAwake int `json:"max_awake,omitempty"`

	// WakeScanInterval is how often the box lists due scheduled wakes. Default 30s.
	WakeScanInterval caddy.Duration `json:"wake_scan_interval,omitempty"`

	// DrainTimeout bounds the drain at process shutdown (checkpoint and release every
	// awake space), so a stuck bucket or instance cannot hold leases forever; spaces not
	// drained by then are left to their last sync. Default 60s.
	DrainTimeout caddy.Duration `json:"drain_timeout,omitempty"`

	// TombstoneTTL is how long a deleted host is remembered, so that a replicated row
	// older than the delete, arriving late, cannot bring it back. Default 7 days
	// (registry.DefaultTombstoneTTL).
	TombstoneTTL caddy.Duration `json:"tombstone_ttl,omitempty"`

	// Mesh tunes the mesh (intervals, trusted roots for peers). The mesh is on only
	// when LCHAT_MESH_SELF is set; see MeshOptions.
	Mesh *MeshOptions `json:"mesh,omitempty"`

	// WildcardDomains are the domains whose wildcard certificate (*.<domain>) this box
	// asks the tls app to obtain and renew; each value may hold several, separated
	// by commas or spaces, and placeholders. The policy covering them needs a DNS-01
	// challenge. Default: {env.LCHAT_WILDCARD_DOMAINS}, and none when that is empty.
	WildcardDomains []string `json:"wildcard_domains,omitempty"`

	tlsApp  *caddytls.TLS // set when there are wildcard domains
	reloc   relocator     // mesh.relocate_dns and mesh.region_buckets (relocate.go)
	meshCfg mesh.Config
	kinds   map[string]engine.Kind
	poolKey string
	shared  *shared
	logger  *zap.Logger
	// prevKinds are the kinds the engine ran before this config's Start applied its
	// own; Stop puts them back if this config's start is unwound.
	prevKinds map[string]engine.Kind
}

// Kind configures how this box runs one kind of space. The command always comes from
// here, never from a route, since routes may arrive from peers.
type Kind struct {
	// Command is the executable: an absolute path, a name in PATH, or "{self}" for
	// this lchat-caddy binary. Required.
	Command string `json:"command,omitempty"`
	// Args are the command's arguments.
	Args []string `json:"args,omitempty"`
	// Env is extra environment from this box's config (placeholders expanded).
	Env map[string]string `json:"env,omitempty"`
	// AllowedEnv lists the route env names this kind passes to the instance.
	// Loader and shell variables (PATH, LD_*, ...) are never allowed.
	AllowedEnv []string `json:"allowed_env,omitempty"`
	// IdleTimeout sleeps a space this long after its last request. Default 10m.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`
	// StopSignal asks the instance to stop: "SIGTERM" (default), "SIGINT",
	// "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2".
	StopSignal string `json:"stop_signal,omitempty"`
	// StopGrace is the wait after StopSignal before SIGKILL. Default 10s.
	StopGrace caddy.Duration `json:"stop_grace,omitempty"`
	// ReadyPath, when set, must answer 2xx over the socket before the space is
	// ready; empty means the socket accepting a connection is enough.
	ReadyPath string `json:"ready_path,omitempty"`
	// ReadyTimeout bounds a wake. Default 30s.
	ReadyTimeout caddy.Duration `json:"ready_timeout,omitempty"`
	// Replication says when an awake space's state goes to the bucket.
	// Default: periodic, every 60s.
	Replication *Replication `json:"replication,omitempty"`
	// WakePath is the POST target of scheduled wakes. Default "/".
	WakePath string `json:"wake_path,omitempty"`
	// Retention is how long this kind's checkpoints stay restorable (history, point-in-time
	// restore). Default 7 days.
	Retention caddy.Duration `json:"retention,omitempty"`
	// GCGrace is how young an unreferenced object must be to survive garbage collection
	// (covers uploads, restores and relocate copies in flight). Default 1h.
	GCGrace caddy.Duration `json:"gc_grace,omitempty"`
	// Isolation is "on" (each space under its own uid and cgroup, or refuse to
	// start, naming what is missing), "none" (the box's own user, a process group:
	// the opt-out), or empty (default): on where this box can, else none.
	Isolation string `json:"isolation,omitempty"`
	// Limits bound each instance of this kind and every process it starts. Default
	// none.
	Limits *Limits `json:"limits,omitempty"`
	// Network is what an instance reaches: "egress" (the internet and this box's
	// resolver; never this box, its loopback and own addresses, link-local and
	// metadata addresses, private ranges or the mesh peers, refused at once), "none"
	// (an empty network namespace: loopback only), "host" (the box's network, the
	// opt-out), or empty (default): egress when the kind is isolated and this box can
	// install the filter (CAP_NET_ADMIN), else host. egress and none need isolation.
	Network string `json:"network,omitempty"`
	// NetworkAllow re-opens ranges (CIDR, or an address) for network egress, such as a
	// database on the private network. Default none.
	NetworkAllow []string `json:"network_allow,omitempty"`
}

// Limits bound an instance through its cgroup; a kind asking for one the host cannot
// enforce is refused at start-up.
type Limits struct {
	// Memory is the memory limit in bytes (swap included where the host accounts it).
	// The kernel kills the instance at the limit; that counts as a crash. Default 0:
	// none.
	Memory int64 `json:"memory,omitempty"`
	// CPU is a share of one core (0.5 is half a core, 2 is two). Default 0: none.
	CPU float64 `json:"cpu,omitempty"`
	// Pids caps the processes and threads. Default 0: none.
	Pids int64 `json:"pids,omitempty"`
}

// UIDRange is a range of uids.
type UIDRange struct {
	// First is the lowest uid. Default 3000000.
	First uint32 `json:"first,omitempty"`
	// Count is how many uids. Default 65536.
	Count uint32 `json:"count,omitempty"`
}

// InstanceLog caps each space's instance.log.
type InstanceLog struct {
	// MaxSizeMB is the size in MiB at which the log rotates. Default 10.
	MaxSizeMB int `json:"max_size_mb,omitempty"`
	// Keep is how many rotated files each space keeps. Default 2.
	Keep int `json:"keep,omitempty"`
}

// Replication is a kind's replication class.
type Replication struct {
	// Class is "sleep", "periodic" (default) or "continuous".
	Class string `json:"class,omitempty"`
	// Interval is the periodic class's interval. Default 60s.
	Interval caddy.Duration `json:"interval,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "lchat",
		New: func() caddy.Module { return new(App) },
	}
}

// shared is what outlives a reload: one per registry path.
type shared struct {
	reg          *registry.Registry
	eng          *engine.Engine
	bucket       bucket.Bucket
	logger       *zap.Logger
	mesh         *meshState // nil without LCHAT_MESH_SELF
	drainTimeout time.Duration
	ids          ledger.Allocators // the id ledger's allocators (ids.go, mint.go)
	// counted is bucket, counting its requests; requests counts the lchat handler's
	// requests. Both only grow; the console charts their rates.
	counted  *bucket.Counted
	requests atomic.Uint64
	drain    drainState // the drain, started at once on a process exit (shutdown.go)

	// kindsMu serializes applying kinds (App.Start) and unwinding them (App.Stop).
	kindsMu sync.Mutex
	// kindsFrom is the config whose kinds the engine runs; nil after an unwind.
	kindsFrom *App
}

// Destruct drains every awake space (checkpoint, release the lease) and closes the
// registry. The pool calls it when the last config using this registry lets go.
//
// With the mesh, the heartbeat is first rewritten as draining, not deleted: peers stop
// placing spaces here at their next listing, yet this box stays live, so the lease of a
// space it is still checkpointing cannot be taken over (and the takeover's writes lost to
// this box's final checkpoint). Each lease is released as its space is drained, which
// frees it at once; the heartbeat is deleted last. See mesh.Membership.MarkDraining.
func (s *shared) Destruct() error {
	start := time.Now()
	if s.drain.stop != nil {
		close(s.drain.stop)
	}
	err := s.drainSpaces() // already under way, or done, on a process exit
	s.eng.Close()
	if s.mesh != nil {
		// Every drain write has returned by now: only then may peers count this box gone.
		s.mesh.leave()
		s.mesh.close()
	}
	if cerr := s.reg.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.logger.Error("draining spaces", zap.Error(err), zap.Duration("took", time.Since(start)))
		return fmt.Errorf("draining spaces: %v", err)
	}
	s.logger.Info("drained spaces", zap.Duration("took", time.Since(start)))
	return nil
}

var pool = caddy.NewUsagePool()

// Provision sets defaults, expands placeholders, loads the bucket and joins (or
// creates) the registry and engine for the registry path.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }

	dataDir := filepath.Join(caddy.AppDataDir(), "lchat")
	a.StateDir = expand(a.StateDir)
	if a.StateDir == "" {
		a.StateDir = filepath.Join(dataDir, "state")
	}
	a.Registry = expand(a.Registry)
	if a.Registry == "" {
		a.Registry = filepath.Join(dataDir, "registry.db")
	}
	var err error
	if a.StateDir, err = filepath.Abs(a.StateDir); err != nil {
		return fmt.Errorf("state_dir: %v", err)
	}
	if a.Registry, err = filepath.Abs(a.Registry); err != nil {
		return fmt.Errorf("registry: %v", err)
	}
	if a.WakeScanInterval == 0 {
		a.WakeScanInterval = caddy.Duration(30 * time.Second)
	}
	if a.DrainTimeout == 0 {
		a.DrainTimeout = caddy.Duration(60 * time.Second)
	}

	a.kinds = make(map[string]engine.Kind, len(a.Kinds))
	for name, kc := range a.Kinds {
		k, err := kc.engineKind(name, expand)
		if err != nil {
			return fmt.Errorf("kinds.%s: %v", name, err)
		}
		a.kinds[name] = k
	}

	if a.meshCfg, err = parseMeshEnv(); err != nil {
		return err
	}
	// Checked now, applied in Start: a config that fails to provision must not
	// change the kinds the running one serves with.
	if err := engine.CheckKinds(a.kinds); err != nil {
		return fmt.Errorf("kinds: %v", err)
	}
	if err := a.provisionWildcards(ctx); err != nil {
		return err
	}
	if err := a.provisionRelocate(ctx); err != nil {
		return err
	}
	if err := a.checkConsistency(); err != nil {
		return err
	}

	var bkt bucket.Bucket
	if a.BucketRaw != nil {
		mod, err := ctx.LoadModule(a, "BucketRaw")
		if err != nil {
			return fmt.Errorf("loading bucket: %v", err)
		}
		b, ok := mod.(bucket.Bucket)
		if !ok {
			return fmt.Errorf("bucket: module %T is not a bucket", mod)
		}
		bkt = b
	}

	val, loaded, err := pool.LoadOrNew(a.Registry, func() (caddy.Destructor, error) {
		return a.newShared(ctx, bkt, dataDir)
	})
	if err != nil {
		return err
	}
	a.poolKey = a.Registry
	a.shared = val.(*shared)
	if loaded {
		// The engine keeps running across the reload; Start gives it this config's
		// kinds, so the next wake of each space uses them.
		if bkt != nil && bkt.String() != a.shared.bucket.String() {
			a.logger.Warn("bucket changed in config; the running engine keeps its bucket until the process restarts",
				zap.String("running", a.shared.bucket.String()), zap.String("configured", bkt.String()))
		}
	}
	registerMetrics(ctx, a)
	registerMeshMetrics(ctx, a)
	return nil
}

// checkBucketAtStart races a few conditional writes on the bucket before the box serves
// (bucket/check.AtStart) and refuses to start on a store that lets two writers win: every
// lease, manifest swap and id block relies on those conditions. A check that cannot run
// (the store unreachable at start) is logged, not fatal: leases fail closed meanwhile.
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

func (a *App) newShared(ctx caddy.Context, bkt bucket.Bucket, dataDir string) (*shared, error) {
	if bkt == nil {
		root := filepath.Join(dataDir, "bucket")
		fb, err := filebucket.New(root)
		if err != nil {
			return nil, fmt.Errorf("opening default file bucket %s: %v", root, err)
		}
		bkt = fb
	}
	if err := checkBucketAtStart(bkt, ctx.Logger()); err != nil {
		return nil, err
	}
	counted := bucket.NewCounted(bkt)
	bkt = counted
	if err := os.MkdirAll(a.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state_dir: %v", err)
	}
	// Revisions of this box's changes name it by its mesh SELF (registry/version.go).
	origin := a.meshCfg.Self
	if origin == "" {
		origin = "local"
	}
	reg, err := registry.Open(a.Registry, registry.Options{Origin: origin, TombstoneTTL: time.Duration(a.TombstoneTTL)})
	if err != nil {
		return nil, err
	}
	id, err := caddy.InstanceID()
	if err != nil {
		reg.Close()
		return nil, fmt.Errorf("reading instance id: %v", err)
	}
	var inc [8]byte
	rand.Read(inc[:])
	logger := ctx.Logger().Named("engine")
	var ms *meshState
	if a.meshCfg.Enabled() {
		if ms, err = newMeshState(a.meshCfg, a.Mesh, bkt, ctx.Logger().Named("mesh")); err != nil {
			reg.Close()
			return nil, err
		}
		ms.catchUp.TombstoneTTL = time.Duration(a.TombstoneTTL)
	}
	ecfg := engine.Config{
		Bucket:           bkt,
		StateDir:         a.StateDir,
		Holder:           "box:" + id.String(),
		Incarnation:      hex.EncodeToString(inc[:]),
		Kinds:            a.kinds,
		MaxAwake:         a.MaxAwake,
		WakeScanInterval: time.Duration(a.WakeScanInterval),
		UIDFirst:         a.UIDRange.first(),
		UIDCount:         a.UIDRange.count(),
		LogMaxMB:         a.InstanceLog.maxSizeMB(),
		LogBackups:       a.InstanceLog.keep(),
		Resolve: func(host string) (engine.Space, bool) {
			rt, ok := reg.Lookup(host)
			if !ok || !rt.Hibernate {
				return engine.Space{}, false
			}
			return engine.Space{Host: rt.Host, Kind: rt.Kind, Version: rt.Version, Env: rt.Env}, true
		},
		Logger: logger,
	}
	if ms != nil {
		ms.engineConfig(&ecfg, reg)
	}
	eng, err := engine.New(ecfg)
	if err != nil {
		reg.Close()
		return nil, fmt.Errorf("starting engine: %v", err)
	}
	if ms != nil {
		if err := ms.start(eng, reg); err != nil {
			eng.Close()
			reg.Close()
			return nil, fmt.Errorf("starting mesh membership: %v", err)
		}
		a.logger.Info("mesh on", zap.Stringer("mesh", ms.cfg), zap.Duration("beat", ms.m.Config().Beat),
			zap.Duration("dead_after", ms.m.Config().DeadAfter), zap.Bool("fenced", ms.m.Fenced()))
	}
	a.logger.Info("lchat registry and engine ready",
		zap.String("registry", a.Registry), zap.Int("routes", reg.Len()),
		zap.String("bucket", bkt.String()), zap.String("state_dir", a.StateDir))
	eng.Observe(observeMetrics)
	s := &shared{reg: reg, eng: eng, bucket: bkt, counted: counted, logger: ctx.Logger(), mesh: ms, drainTimeout: time.Duration(a.DrainTimeout)}
	s.watchExit()
	return s, nil
}

// checkConsistency refuses a mesh config that contradicts itself and logs what only
// looks wrong (mesh.CheckConfig holds the rules).
func (a *App) checkConsistency() error {
	if !a.meshCfg.Enabled() {
		return nil
	}
	facts := mesh.ConfigFacts{Self: a.meshCfg.Self, Domains: a.meshCfg.Domains, Wildcards: a.WildcardDomains}
	if a.reloc.dns != nil {
		facts.RelocateZone = a.reloc.dns.Zone
	}
	p := mesh.CheckConfig(facts)
	for _, w := range p.Warn {
		a.logger.Warn(w, zap.String("self", a.meshCfg.Self))
	}
	if len(p.Refuse) > 0 {
		return fmt.Errorf("contradictory config: %s", strings.Join(p.Refuse, "; "))
	}
	return nil
}

// Validate checks the config across fields.
func (a *App) Validate() error {
	if r := a.UIDRange; r != nil && (r.First == 0 && r.Count != 0 || uint64(r.First)+uint64(r.Count) >= 1<<32-1) {
		return fmt.Errorf("uid_range: must start above 0 and end below 4294967295")
	}
	if l := a.InstanceLog; l != nil && (l.MaxSizeMB < 0 || l.Keep < 0) {
		return fmt.Errorf("instance_log: size and keep must not be negative")
	}
	if a.MaxAwake < 0 {
		return fmt.Errorf("max_awake: must not be negative, got %d", a.MaxAwake)
	}
	if a.WakeScanInterval < 0 {
		return fmt.Errorf("wake_scan_interval: must be positive")
	}
	if a.DrainTimeout < 0 {
		return fmt.Errorf("drain_timeout: must be positive")
	}
	return nil
}

// Start applies this config's kinds (Start runs only for a config that provisioned
// fully) and starts the engine's background loops (idempotent across reloads).
func (a *App) Start() error {
	s := a.shared
	s.kindsMu.Lock()
	prev := s.eng.Kinds()
	if err := s.eng.SetKinds(a.kinds); err != nil {
		s.kindsMu.Unlock()
		return fmt.Errorf("kinds: %v", err)
	}
	a.prevKinds, s.kindsFrom = prev, a
	s.kindsMu.Unlock()
	s.eng.Start()
	return a.manageWildcards()
}

// Stop keeps the spaces awake: a reload stops the old config too, and a reload must
// keep them running. Draining happens when the pool lets go of the engine (Cleanup).
// When this config's kinds are still the engine's, Stop means its start is being
// unwound (another app failed to start, so the running config stays): the kinds the
// engine ran before are put back. After a successful reload the new config's kinds
// are the engine's, and the old config's Stop changes nothing.
func (a *App) Stop() error {
	s := a.shared
	if s == nil {
		return nil
	}
	s.kindsMu.Lock()
	defer s.kindsMu.Unlock()
	if s.kindsFrom == a && a.prevKinds != nil {
		if err := s.eng.SetKinds(a.prevKinds); err != nil {
			return fmt.Errorf("restoring kinds: %v", err)
		}
		s.kindsFrom = nil
	}
	return nil
}

// Cleanup releases this config's reference to the registry and engine; the last
// reference drains them.
func (a *App) Cleanup() error {
	if a.poolKey == "" {
		return nil
	}
	_, err := pool.Delete(a.poolKey)
	a.poolKey = ""
	return err
}

// Engine returns the hibernation engine.
func (a *App) Engine() *engine.Engine { return a.shared.eng }

// checkRoute refuses a route this box cannot serve (engine.CheckRoute).
func (a *App) checkRoute(rt *registry.Route) error {
	return engine.CheckRoute(a.kinds, rt)
}

// engineKind converts a configured kind to the engine's: placeholders expanded, "{self}"
// resolved to this binary, durations and the signal name converted. The engine's
// CheckKinds applies the defaults and the rules.
func (kc *Kind) engineKind(name string, expand func(string) string) (engine.Kind, error) {
	if kc == nil {
		return engine.Kind{}, errors.New("empty kind")
	}
	k := engine.Kind{
		Name:         name,
		Command:      expand(kc.Command),
		IdleTimeout:  time.Duration(kc.IdleTimeout),
		StopGrace:    time.Duration(kc.StopGrace),
		ReadyPath:    kc.ReadyPath,
		ReadyTimeout: time.Duration(kc.ReadyTimeout),
		WakePath:     kc.WakePath,
		AllowedEnv:   kc.AllowedEnv,
		Retention:    time.Duration(kc.Retention),
		GCGrace:      time.Duration(kc.GCGrace),
		Isolation:    kc.Isolation,
		Network:      kc.Network,
	}
	for _, a := range kc.NetworkAllow {
		p, err := engine.ParseAllow(expand(a))
		if err != nil {
			return k, err
		}
		k.NetworkAllow = append(k.NetworkAllow, p)
	}
	if l := kc.Limits; l != nil {
		k.Limits = engine.Limits{MemoryBytes: l.Memory, CPU: l.CPU, Pids: l.Pids}
	}
	if k.Command == "{self}" {
		exe, err := os.Executable()
		if err != nil {
			return k, fmt.Errorf("command: resolving {self}: %v", err)
		}
		k.Command = exe
	}
	for _, arg := range kc.Args {
		k.Args = append(k.Args, expand(arg))
	}
	if len(kc.Env) > 0 {
		k.Env = make(map[string]string, len(kc.Env))
		for n, v := range kc.Env {
			k.Env[n] = expand(v)
		}
	}
	sig, err := engine.ParseSignal(kc.StopSignal)
	if err != nil {
		return k, err
	}
	k.StopSignal = sig
	if r := kc.Replication; r != nil {
		k.Replication = engine.Replication{Class: r.Class, Interval: time.Duration(r.Interval)}
	}
	return k, nil
}

func (r *UIDRange) first() uint32 {
	if r == nil {
		return 0
	}
	return r.First
}

func (r *UIDRange) count() uint32 {
	if r == nil {
		return 0
	}
	return r.Count
}

func (l *InstanceLog) maxSizeMB() int {
	if l == nil {
		return 0
	}
	return l.MaxSizeMB
}

func (l *InstanceLog) keep() int {
	if l == nil {
		return 0
	}
	return l.Keep
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*shared)(nil)
)
