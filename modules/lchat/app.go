// Package lchat is the Caddy glue of lchat-caddy on one box: the `lchat` app (its config,
// provisioning a box.Box), the `http.handlers.lchat` handler, the peer API, the
// `admin.api.lchat*` endpoints and the CLI subcommands that call them. Every endpoint
// decodes its request, calls the box, and encodes the answer; what a change does is the
// box's (package box).
package lchat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/held"
	"github.com/lchat/lchat-caddy/internal/buildinfo"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the `lchat` app: the config of the box (box.Box: the routes of this box, the
// bucket their state lives in, the hibernation engine that wakes and sleeps them, the
// mesh). The box outlives config reloads (it is held in a usage pool keyed by the
// registry path), so a reload keeps every awake instance and its lease; only the last
// config letting go of it (process exit, or a config without this app) drains the spaces.
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

	// Connections bounds the WebSocket connections this box holds for instances that
	// opt in (docs/connections.md). Read when the box opens: a reload keeps the running
	// limits.
	Connections *Connections `json:"connections,omitempty"`

	// MaxAwake caps the awake spaces on this box; the least recently used sleeps
	// first. Default 0: unlimited.
	MaxAwake int `json:"max_awake,omitempty"`

	// MaxStarting caps the instances starting at once (exec to first answer), admitted
	// in the order of their first requests, so a storm of wakes answers in order at the
	// box's full rate. Default 0: twice the CPUs the box may use.
	MaxStarting int `json:"max_starting,omitempty"`

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

	// Providers are the partners this fleet may delegate spaces to
	// (modules/lchat/providers.go, docs/providers.md). Default: none.
	Providers []*ProviderConfig `json:"providers,omitempty"`

	// ProviderClients are the fleets this fleet hosts spaces for, as their provider.
	// Default: none.
	ProviderClients []*ProviderClientConfig `json:"provider_clients,omitempty"`

	prov     *providerSet  // this config's providers and clients (providers.go)
	tlsApp   *caddytls.TLS // set when there are wildcard domains
	reloc    relocator     // mesh.relocate_dns and mesh.region_buckets (relocate.go)
	meshCfg  mesh.Config
	kinds    map[string]engine.Kind
	poolKey  string
	box      *box.Box
	conns    *held.Conns   // the box's held connections; nil where they cannot be held
	settings *box.Settings // what this config gives the box from its Start on
	logger   *zap.Logger
	// prevCurrent is what current pointed at before this config's Start; Stop puts it
	// back if this config's start is unwound.
	prevCurrent *box.Box
}

// Kind configures how this box runs one kind of space. The command always comes from
// here, never from a route, since routes may arrive from peers.
type Kind struct {
	// Command is the executable: an absolute path, a name in PATH, "{self}" for
	// this lchat-caddy binary, or "{demo_space}" for the demo space (lchat-demo-space
	// next to this binary, else this binary's demo-space alias). Required.
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
	// Durability is what a write the instance answered for survives: "bucket" (every
	// answer waits until the SQLite commits before it are in the space's log in the
	// bucket: the box's death loses none of them) or "checkpoint" (the replication
	// class bounds what a box's death takes). Default "checkpoint".
	Durability string `json:"durability,omitempty"`
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
	// Tmp is what an instance sees on /tmp and /var/tmp: "private" (a directory of the
	// space's own, in its disk with limits.disk, emptied at each start; needs isolation
	// and CAP_SYS_ADMIN), "host" (the box's /tmp, the opt-out), or empty (default):
	// private when the kind is isolated and this box can, else host.
	Tmp string `json:"tmp,omitempty"`
	// SocketActivation has the box bind the space's socket and pass it to the instance
	// as fd 3 (LISTEN_FDS=1, LISTEN_FDNAMES=http, LISTEN_PID=1, the instance pid 1 of its
	// own PID namespace; docs/socket-activation.md), so a wake proxies its first request
	// at once. Needs CAP_SYS_ADMIN (else unprivileged user namespaces, for a kind that is
	// not isolated). Default false: the instance binds $LCHAT_SOCKET.
	SocketActivation bool `json:"socket_activation,omitempty"`
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
	// Disk caps the space's data dir and its /tmp together, in bytes (at least 16MiB):
	// they live in an ext4 image of this size, mounted while the space is on this box.
	// A write past it fails with ENOSPC. Needs isolation, CAP_SYS_ADMIN, loop devices
	// and mkfs.ext4. Default 0: none.
	Disk int64 `json:"disk,omitempty"`
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

// Connections bounds held WebSocket connections (connhold.Limits).
type Connections struct {
	// MaxMessage is the largest client message in bytes; larger closes with 1009.
	// Default 1 MiB.
	MaxMessage int `json:"max_message,omitempty"`
	// MaxPending is the most client messages one connection keeps for its instance;
	// one more closes it with 1013. Default 1024.
	MaxPending int `json:"max_pending,omitempty"`
	// MaxPendingBytes is the same bound in bytes. Default 4 MiB.
	MaxPendingBytes int `json:"max_pending_bytes,omitempty"`
	// MaxBoxPendingBytes bounds the pending bytes of every held connection together.
	// Default 256 MiB.
	MaxBoxPendingBytes int64 `json:"max_box_pending_bytes,omitempty"`
	// MaxOutBytes is the most bytes queued towards one client; past it the client is
	// closed with 1008. Default 1 MiB.
	MaxOutBytes int `json:"max_out_bytes,omitempty"`
	// MaxBoxOutBytes is the same bound for the whole box. Default 256 MiB.
	MaxBoxOutBytes int64 `json:"max_box_out_bytes,omitempty"`
	// WriteTimeout bounds one write to a client. Default 10s.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`
}

// limits is c as connhold.Limits (zero fields: connhold's defaults).
func (c *Connections) limits() connhold.Limits {
	if c == nil {
		return connhold.Limits{}
	}
	return connhold.Limits{MaxMessage: c.MaxMessage, MaxPending: c.MaxPending, MaxPendingBytes: c.MaxPendingBytes,
		MaxBoxPendingBytes: c.MaxBoxPendingBytes, MaxOutBytes: c.MaxOutBytes, MaxBoxOutBytes: c.MaxBoxOutBytes,
		WriteTimeout: time.Duration(c.WriteTimeout)}
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

// pooled is what outlives a reload: the box, one per registry path, and its held
// WebSocket connections (nil where they cannot be held). The pool destructs it when the
// last config using the registry lets go (box.Box.Close drains it).
type pooled struct {
	*box.Box
	conns *held.Conns
}

// Destruct closes the held connections (1012), then drains and closes the box, telling
// the boxes that hold connections of its spaces what the drain saved.
func (p pooled) Destruct() error {
	if p.conns != nil {
		connsOf.Delete(p.Box)
		p.conns.Close()
		defer p.conns.Finish()
	}
	return p.Close()
}

var pool = caddy.NewUsagePool()

// envCloudRegion stamps the home_region of spaces created on this box (region-scoped
// placement: a space is placed in its region from its first wake).
const envCloudRegion = "LCHAT_CLOUD_REGION"

// Provision sets defaults, expands placeholders, loads the bucket and joins (or
// opens) the box for the registry path.
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

	if a.meshCfg, err = mesh.ParseEnv(os.Getenv); err != nil {
		return fmt.Errorf("mesh configuration: %v", err)
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
	if err := a.provisionProviders(); err != nil {
		return err
	}
	registerProviderMetrics(ctx, a.logger)
	idLedger, err := idLedgerFromEnv()
	if err != nil {
		return err
	}
	a.settings = &box.Settings{Kinds: a.kinds, WildcardDomains: a.WildcardDomains,
		IDLedger: idLedger, RegionBuckets: a.reloc.buckets}
	if d := a.reloc.dns; d != nil {
		a.settings.RelocateDNS = mesh.RecordSetter{Zone: d.Zone, TTL: time.Duration(d.TTL), Setter: d.setter, Name: d.name}
	}
	if r := strings.TrimSpace(os.Getenv(envCloudRegion)); r != "" {
		if err := registry.ValidateRegion(r); err != nil {
			return fmt.Errorf("%s: %v", envCloudRegion, err)
		}
		a.settings.CloudRegion = r
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
		b, err := a.openBox(ctx, bkt, dataDir)
		if err != nil {
			return pooled{b, nil}, err
		}
		cs, cerr := held.New(held.Config{Box: b, StateDir: a.StateDir, Limits: a.Connections.limits(), Logger: a.logger})
		if cerr != nil {
			a.logger.Warn("WebSockets cannot be held on this box; every upgrade is tunnelled", zap.Error(cerr))
			return pooled{b, nil}, nil
		}
		connsOf.Store(b, cs)
		b.SetCounters(cs.Counters)
		b.SetSpaceConns(cs.SpaceConns)
		b.SetHeldCost(func() int64 {
			st := cs.Stats()
			return box.HeldCost(st.Held, st.Streams, st.PendingBytes, st.OutBytes)
		})
		return pooled{b, cs}, nil
	})
	if err != nil {
		return err
	}
	a.poolKey = a.Registry
	a.box = val.(pooled).Box
	a.conns = val.(pooled).conns
	if loaded && bkt != nil && bkt.String() != a.box.Bucket().String() {
		// The engine keeps running across the reload with the bucket it was opened on.
		a.logger.Warn("bucket changed in config; the running engine keeps its bucket until the process restarts",
			zap.String("running", a.box.Bucket().String()), zap.String("configured", bkt.String()))
	}
	registerMetrics(ctx, a)
	return nil
}

// openBox opens the box of this config's registry path (box.Open holds the start order).
func (a *App) openBox(ctx caddy.Context, bkt bucket.Bucket, dataDir string) (*box.Box, error) {
	if bkt == nil {
		root := filepath.Join(dataDir, "bucket")
		fb, err := filebucket.New(root)
		if err != nil {
			return nil, fmt.Errorf("opening default file bucket %s: %v", root, err)
		}
		bkt = fb
	}
	id, err := caddy.InstanceID()
	if err != nil {
		return nil, fmt.Errorf("reading instance id: %v", err)
	}
	// Which lchat build runs, beside Caddy's version: the heartbeat carries it to the
	// console's VERSION column and the fleet.
	version := buildinfo.String()
	return box.Open(box.Config{
		Bucket:       bkt,
		StateDir:     a.StateDir,
		Registry:     a.Registry,
		TombstoneTTL: time.Duration(a.TombstoneTTL),
		DrainTimeout: time.Duration(a.DrainTimeout),
		Holder:       "box:" + id.String(),
		Engine: engine.Config{
			Kinds:            a.kinds,
			MaxAwake:         a.MaxAwake,
			MaxStarting:      a.MaxStarting,
			WakeScanInterval: time.Duration(a.WakeScanInterval),
			UIDFirst:         a.UIDRange.first(),
			UIDCount:         a.UIDRange.count(),
			LogMaxMB:         a.InstanceLog.maxSizeMB(),
			LogBackups:       a.InstanceLog.keep(),
		},
		Mesh:        a.meshCfg,
		MeshOptions: a.Mesh.options(),
		Version:     version,
		Observer:    observeMetrics,
		// Caddy stops its apps one after the other and destructs the pool only after
		// the http app has stopped, which waits for open requests; the box drains as
		// soon as the process is exiting instead (box.Box.Drain). Caddy offers no hook
		// that runs before its apps stop except the events app, which a config may not
		// load, so the box polls caddy.Exiting.
		Exiting: caddy.Exiting,
		Logger:  ctx.Logger(),
	})
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
	if c := a.Connections; c != nil && (c.MaxMessage < 0 || c.MaxPending < 0 || c.MaxPendingBytes < 0 ||
		c.MaxBoxPendingBytes < 0 || c.MaxOutBytes < 0 || c.MaxBoxOutBytes < 0 || c.WriteTimeout < 0) {
		return fmt.Errorf("connections: limits must be positive")
	}
	if l := a.InstanceLog; l != nil && (l.MaxSizeMB < 0 || l.Keep < 0) {
		return fmt.Errorf("instance_log: size and keep must not be negative")
	}
	if a.MaxAwake < 0 {
		return fmt.Errorf("max_awake: must not be negative, got %d", a.MaxAwake)
	}
	if err := a.Mesh.validate(); err != nil {
		return err
	}
	if a.MaxStarting < 0 {
		return fmt.Errorf("max_starting: must not be negative, got %d", a.MaxStarting)
	}
	if a.WakeScanInterval < 0 {
		return fmt.Errorf("wake_scan_interval: must be positive")
	}
	if a.DrainTimeout < 0 {
		return fmt.Errorf("drain_timeout: must be positive")
	}
	return nil
}

// Start gives the box this config's settings (its kinds first; Start runs only for a
// config that provisioned fully), starts the engine's loops (idempotent across reloads)
// and points the metrics at the box.
func (a *App) Start() error {
	if err := a.box.Start(a.settings); err != nil {
		return err
	}
	a.prevCurrent = current.Swap(a.box)
	return a.manageWildcards()
}

// Stop keeps the spaces awake: a reload stops the old config too, and a reload must
// keep them running. Draining happens when the pool lets go of the box (Cleanup).
// When this config's settings are still the box's, Stop means its start is being
// unwound (another app failed to start, so the running config stays): the box puts the
// settings before back (box.Box.Stop), and the metrics point where they did.
func (a *App) Stop() error {
	if a.box == nil {
		return nil
	}
	unwound, err := a.box.Stop(a.settings)
	if unwound {
		current.CompareAndSwap(a.box, a.prevCurrent)
	}
	return err
}

// Cleanup releases this config's reference to the box; the last reference drains it.
func (a *App) Cleanup() error {
	a.prov.close()
	if a.poolKey == "" {
		return nil
	}
	_, err := pool.Delete(a.poolKey)
	a.poolKey = ""
	return err
}

// Engine returns the hibernation engine.
func (a *App) Engine() *engine.Engine { return a.box.Engine() }

// Box is the running box, for the subcommands that run one in process (dev).
func (a *App) Box() *box.Box { return a.box }

// FleetView is what the console (http.handlers.lchat_console) reads: the box's console
// source, equal across reloads as long as the box is, so the console keeps its history.
func (a *App) FleetView() fleetview.Source { return a.box.Console() }

// DemoSpaceBinary is the demo space's own small binary, looked for next to lchat-caddy.
const DemoSpaceBinary = "lchat-demo-space"

// DemoSpaceCommand is what "{demo_space}" runs: DemoSpaceBinary next to this executable
// when it is there (a start of a few ms), else this binary's `demo-space` alias (the
// same program behind Caddy's ~150 ms of package inits).
func DemoSpaceCommand() (command string, args []string, err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	small := filepath.Join(filepath.Dir(exe), DemoSpaceBinary)
	if fi, err := os.Stat(small); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return small, nil, nil
	}
	return exe, []string{"demo-space"}, nil
}

// engineKind converts a configured kind to the engine's: placeholders expanded, "{self}"
// and "{demo_space}" resolved to binaries, durations and the signal name converted. The engine's
// CheckKinds applies the defaults and the rules.
func (kc *Kind) engineKind(name string, expand func(string) string) (engine.Kind, error) {
	if kc == nil {
		return engine.Kind{}, errors.New("empty kind")
	}
	k := engine.Kind{
		Name:             name,
		Command:          expand(kc.Command),
		IdleTimeout:      time.Duration(kc.IdleTimeout),
		StopGrace:        time.Duration(kc.StopGrace),
		ReadyPath:        kc.ReadyPath,
		ReadyTimeout:     time.Duration(kc.ReadyTimeout),
		WakePath:         kc.WakePath,
		AllowedEnv:       kc.AllowedEnv,
		Retention:        time.Duration(kc.Retention),
		GCGrace:          time.Duration(kc.GCGrace),
		Isolation:        engine.Isolation(kc.Isolation),
		Network:          engine.Network(kc.Network),
		Tmp:              engine.Tmp(kc.Tmp),
		SocketActivation: kc.SocketActivation,
		Durability:       engine.Durability(kc.Durability),
	}
	for _, a := range kc.NetworkAllow {
		p, err := engine.ParseAllow(expand(a))
		if err != nil {
			return k, err
		}
		k.NetworkAllow = append(k.NetworkAllow, p)
	}
	if l := kc.Limits; l != nil {
		k.Limits = engine.Limits{MemoryBytes: l.Memory, CPU: l.CPU, Pids: l.Pids, DiskBytes: l.Disk}
	}
	switch k.Command {
	case "{self}":
		exe, err := os.Executable()
		if err != nil {
			return k, fmt.Errorf("command: resolving {self}: %v", err)
		}
		k.Command = exe
	case "{demo_space}":
		cmd, args, err := DemoSpaceCommand()
		if err != nil {
			return k, fmt.Errorf("command: resolving {demo_space}: %v", err)
		}
		k.Command, k.Args = cmd, args
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
		k.Replication = engine.Replication{Class: engine.ReplicationClass(r.Class), Interval: time.Duration(r.Interval)}
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
	_ caddy.Destructor   = pooled{}
)
