// Package derpswitch is the Caddy app `derp_switch`: it keeps this box's Tailscale DERP
// home connection and moves it between regions make-before-break, with the operator
// pin on the admin API (`admin.api.derp_switch`). The state machine lives in the plain
// package github.com/lchat/lchat-caddy/derpswitch; this package is the Caddy glue:
// config, storage (node key, pin), the reload-safe connection pool, admin and metrics.
package derpswitch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"

	"github.com/lchat/lchat-caddy/derpswitch"
)

func init() {
	caddy.RegisterModule(App{})
}

// Storage keys under Caddy's configured storage.
const (
	nodeKeyStorageKey = "derp_switch/node_key"
	pinStorageKey     = "derp_switch/pin.json"
)

// pool holds the running switchers across config reloads, keyed by node identity
// (public key), so a reload with the same identity keeps the DERP connections.
var pool = caddy.NewUsagePool()

// running is the app of the running config, served by the admin endpoints: set when an
// app starts, cleared when it is cleaned up, and handed back to the previous app when
// a reload fails after the new app started (Caddy then keeps the previous config).
var running struct {
	mu sync.Mutex
	// app is the running app.
	app *App
}

func runningApp() *App {
	running.mu.Lock()
	defer running.mu.Unlock()
	return running.app
}

// markRunning makes a the running app and remembers the one it replaces.
func markRunning(a *App) {
	running.mu.Lock()
	defer running.mu.Unlock()
	a.prev, running.app = running.app, a
}

// App is the `derp_switch` Caddy app.
type App struct {
	// DERPMap is an inline DERP map (tailcfg.DERPMap JSON: {"Regions": {...}}).
	// Exactly one of derp_map and derp_map_file is required.
	DERPMap json.RawMessage `json:"derp_map,omitempty"`
	// DERPMapFile is the path of a DERP map JSON file.
	DERPMapFile string `json:"derp_map_file,omitempty"`
	// HomeRegion is the region boot connects to when no pin is persisted. Default: the
	// lowest region id in the map.
	HomeRegion int `json:"home_region,omitempty"`
	// Mode is "mbb" (default: make-before-break) or "legacy" (teardown and reconnect;
	// kept for comparison runs).
	Mode string `json:"mode,omitempty"`
	// Prove is how an auxiliary connection is proven before it becomes the home.
	Prove *ProveConfig `json:"prove,omitempty"`
	// RetryBackoff is the wait before re-issuing a pin whose switch rolled back, per
	// attempt, the last repeating forever. Default [5s, 15s, 60s].
	RetryBackoff []caddy.Duration `json:"retry_backoff,omitempty"`
	// Drain is how long the old home stays open after a commit. Default 5s.
	Drain caddy.Duration `json:"drain,omitempty"`
	// NegotiateInterval is the most time between negotiator passes. Default 3s.
	NegotiateInterval caddy.Duration `json:"negotiate_interval,omitempty"`
	// Autonegotiate turns on latency-based home selection with damping. Default off.
	Autonegotiate *AutonegConfig `json:"autonegotiate,omitempty"`
	// EchoPrefix: a packet that starts with it, received on any slot, is answered to its
	// sender through the home connection. Default "lchat-echo:"; "off" disables echo.
	EchoPrefix string `json:"echo_prefix,omitempty"`
	// EchoReplyPrefix replaces EchoPrefix in the answer. Default "lchat-echo-reply:".
	EchoReplyPrefix string `json:"echo_reply_prefix,omitempty"`

	// StorageRaw keeps this box's node key and pin: per-box state, never to be shared.
	// Default: Caddy's storage, unless that storage is shared between boxes
	// (caddy.storage.lchat, LCHAT_CERT_CACHE=s3); then a file_system storage in this
	// box's Caddy data directory (`derp_switch/`).
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`

	ctx     caddy.Context
	logger  *zap.Logger
	storage certmagic.Storage // node key and pin; see StorageRaw
	cfg     derpswitch.Config
	poolKey string
	handle  *switcherHandle
	sw      *derpswitch.Switcher

	// prev is the app that was running when this one started; cleanedUp marks an app
	// whose config is gone. Together they let a failed reload hand the admin endpoints
	// (and the switcher's settings) back to the config that keeps running. Both are
	// guarded by running.mu.
	prev      *App
	cleanedUp bool
}

// ProveConfig is the prove gate for an auxiliary connection.
type ProveConfig struct {
	// Count of ping/pong round trips that must succeed. Default 3.
	Count int `json:"count,omitempty"`
	// Timeout for each ping. Default 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Interval between pings. Default 100ms.
	Interval caddy.Duration `json:"interval,omitempty"`
	// ConnectTimeout bounds opening the auxiliary connection. Default 10s.
	ConnectTimeout caddy.Duration `json:"connect_timeout,omitempty"`
}

// AutonegConfig is autonegotiation and its damping.
type AutonegConfig struct {
	// Interval between latency measurements. Default 30s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// StabilityWindow a better region must hold before switching. Default 60s.
	StabilityWindow caddy.Duration `json:"stability_window,omitempty"`
	// Dwell is the minimum time on a home before autonegotiation moves it. Default 5m.
	Dwell caddy.Duration `json:"dwell,omitempty"`
	// MaxSwitchesPerHour opens the breaker. Default 4.
	MaxSwitchesPerHour int `json:"max_switches_per_hour,omitempty"`
	// Ban is how long a region whose autonegotiated switch rolled back is skipped. Default 10m.
	Ban caddy.Duration `json:"ban,omitempty"`
	// History is how far back a region's best DERP latency counts. Default 5m.
	History caddy.Duration `json:"history,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "derp_switch",
		New: func() caddy.Module { return new(App) },
	}
}

// switcherHandle is what the usage pool holds.
type switcherHandle struct {
	sw *derpswitch.Switcher

	mu      sync.Mutex
	started bool

	// pinMu serializes persisting and applying pins, so that concurrent requests
	// cannot leave storage naming one region and the running override another.
	pinMu sync.Mutex
}

// Destruct stops the switcher when the last config using it is gone.
func (h *switcherHandle) Destruct() error { return h.sw.Close() }

// Provision sets up the app.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	a.logger = ctx.Logger()

	m, err := a.loadDERPMap()
	if err != nil {
		return err
	}
	if a.HomeRegion == 0 {
		a.HomeRegion = slices.Min(slices.Collect(maps.Keys(m.Regions)))
	}
	if a.Mode == "" {
		a.Mode = string(derpswitch.ModeMBB)
	}
	if a.EchoPrefix == "" {
		a.EchoPrefix = "lchat-echo:"
	}
	if a.EchoReplyPrefix == "" {
		a.EchoReplyPrefix = "lchat-echo-reply:"
	}

	if a.storage, err = a.boxStorage(ctx); err != nil {
		return err
	}
	priv, err := a.nodeKey(ctx)
	if err != nil {
		return err
	}
	pin, err := a.loadPin(ctx)
	if err != nil {
		return err
	}
	if pin != 0 && m.Regions[pin] == nil {
		a.logger.Warn("persisted pin names a region not in the DERP map; ignoring it", zap.Int("region", pin))
		pin = 0
	}

	cfg := derpswitch.Config{
		DERPMap:      m,
		HomeRegion:   a.HomeRegion,
		Override:     pin,
		Mode:         derpswitch.Mode(a.Mode),
		Drain:        time.Duration(a.Drain),
		TickInterval: time.Duration(a.NegotiateInterval),
		Dial:         derpswitch.DERPHTTPDialer(priv, derpLogf(a.logger.Named("derphttp"))),
		Logger:       a.logger,
	}
	if a.EchoPrefix != "off" {
		cfg.EchoPrefix, cfg.EchoReplyPrefix = []byte(a.EchoPrefix), []byte(a.EchoReplyPrefix)
	}
	for _, d := range a.RetryBackoff {
		cfg.RetryBackoff = append(cfg.RetryBackoff, time.Duration(d))
	}
	if p := a.Prove; p != nil {
		cfg.Prove = derpswitch.ProveConfig{Count: p.Count, Timeout: time.Duration(p.Timeout),
			Interval: time.Duration(p.Interval), ConnectTimeout: time.Duration(p.ConnectTimeout)}
	}
	if an := a.Autonegotiate; an != nil {
		cfg.Autoneg = derpswitch.AutonegConfig{Enabled: true, Interval: time.Duration(an.Interval),
			StabilityWindow: time.Duration(an.StabilityWindow), Dwell: time.Duration(an.Dwell),
			MaxSwitchesPerHour: an.MaxSwitchesPerHour, BanDuration: time.Duration(an.Ban),
			History: time.Duration(an.History)}
		// Latency is measured by DERP ping/pong (the switcher's default). Probes to
		// regions with no live connection use a throwaway key, so they are never a
		// second connection of this node on a region's server.
		cfg.ProbeDial = derpswitch.DERPHTTPDialer(key.NewNode(), derpLogf(a.logger.Named("derphttp.probe")))
	}
	a.cfg = cfg

	// A switcher loaded from the pool (a reload) is handed the new config in Start.
	a.poolKey = priv.Public().String()
	val, _, err := pool.LoadOrNew(a.poolKey, func() (caddy.Destructor, error) {
		sw, err := derpswitch.New(cfg)
		if err != nil {
			return nil, err
		}
		return &switcherHandle{sw: sw}, nil
	})
	if err != nil {
		a.poolKey = ""
		return fmt.Errorf("creating DERP switcher: %v", err)
	}
	a.handle = val.(*switcherHandle)
	a.sw = a.handle.sw
	registerMetrics(ctx.GetMetricsRegistry())
	return nil
}

// Validate checks the configuration.
func (a *App) Validate() error {
	if a.Mode != string(derpswitch.ModeMBB) && a.Mode != string(derpswitch.ModeLegacy) {
		return fmt.Errorf("mode %q: want mbb or legacy", a.Mode)
	}
	if a.Prove != nil && a.Prove.Count < 0 {
		return errors.New("prove count must not be negative")
	}
	if a.cfg.DERPMap != nil && a.cfg.DERPMap.Regions[a.HomeRegion] == nil {
		return fmt.Errorf("home_region %d is not in the DERP map", a.HomeRegion)
	}
	for _, d := range a.RetryBackoff {
		if d <= 0 {
			return fmt.Errorf("retry_backoff %v: every entry must be positive", time.Duration(d))
		}
	}
	return nil
}

// Start starts the switcher, or hands a running one (from before a reload) the new config.
func (a *App) Start() error {
	h := a.handle
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.started {
		h.started = true
		h.sw.Start()
		setCurrent(h.sw)
		markRunning(a)
		a.clearStalePin()
		a.logger.Info("DERP switch started", zap.Int("home_region", a.HomeRegion),
			zap.Int("pin", a.cfg.Override), zap.String("mode", a.Mode), zap.String("node", a.poolKey))
		return nil
	}
	if err := h.sw.Reconfigure(a.cfg); err != nil {
		return fmt.Errorf("reconfiguring DERP switch: %v", err)
	}
	setCurrent(h.sw)
	markRunning(a)
	a.clearStalePin()
	a.logger.Info("DERP switch reconfigured; connections kept", zap.String("node", a.poolKey))
	return nil
}

// Stop does nothing: connections outlive a reload and are released in Cleanup.
func (a *App) Stop() error { return nil }

// Cleanup releases this config's reference to the switcher; the last one closes it.
func (a *App) Cleanup() error {
	running.mu.Lock()
	a.cleanedUp = true
	var back *App
	if running.app == a {
		// This config started but is being unwound. If the one before it was not
		// cleaned up, a reload failed after this app started (another app refused to
		// start): that config keeps running, so its app and settings come back.
		running.app = nil
		if p := a.prev; p != nil && !p.cleanedUp {
			running.app, back = p, p
		}
	}
	running.mu.Unlock()
	if back != nil {
		back.restore()
	}
	if a.poolKey == "" {
		return nil
	}
	_, err := pool.Delete(a.poolKey)
	return err
}

// restore gives the switcher a's settings again after a newer config that had
// reconfigured it failed to start.
func (a *App) restore() {
	h := a.handle
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.sw.Reconfigure(a.cfg); err != nil {
		a.logger.Error("restoring DERP switch settings after a failed reload", zap.Error(err))
	}
	setCurrent(h.sw)
	a.logger.Info("failed reload unwound; DERP switch back on the running config", zap.String("node", a.poolKey))
}

// Switcher returns the running engine.
func (a *App) Switcher() *derpswitch.Switcher { return a.sw }

// SetPin validates, persists and applies an operator pin (0 clears it).
func (a *App) SetPin(ctx context.Context, region int) error {
	if region < 0 || (region != 0 && !a.sw.HasRegion(region)) {
		return fmt.Errorf("region %d: %w", region, derpswitch.ErrUnknownRegion)
	}
	a.handle.pinMu.Lock()
	defer a.handle.pinMu.Unlock()
	if err := a.storePin(ctx, region); err != nil {
		return err
	}
	if err := a.sw.SetOverride(region); err != nil {
		return err
	}
	a.logger.Info("pin routed via negotiator (MBB when live)", zap.Int("derp_region", region))
	return nil
}

// clearStalePin clears the stored pin when it names a region the running DERP map no
// longer has: the switcher cleared it (a reload dropped the region), so a restart must
// not bring it back.
func (a *App) clearStalePin() {
	a.handle.pinMu.Lock()
	defer a.handle.pinMu.Unlock()
	pin, err := a.loadPin(a.ctx)
	if err != nil {
		a.logger.Error("checking the stored DERP pin", zap.Error(err))
		return
	}
	if pin == 0 || a.sw.HasRegion(pin) {
		return
	}
	if err := a.storePin(a.ctx, 0); err != nil {
		a.logger.Error("clearing the stored DERP pin", zap.Error(err))
		return
	}
	a.logger.Warn("stored pin names a region not in the DERP map; cleared", zap.Int("region", pin))
}

func (a *App) loadDERPMap() (*tailcfg.DERPMap, error) {
	raw := []byte(a.DERPMap)
	switch {
	case len(raw) > 0 && a.DERPMapFile != "":
		return nil, errors.New("derp_map and derp_map_file are exclusive")
	case a.DERPMapFile != "":
		b, err := os.ReadFile(a.DERPMapFile)
		if err != nil {
			return nil, fmt.Errorf("reading DERP map: %v", err)
		}
		raw = b
	case len(raw) == 0:
		return nil, errors.New("a DERP map is required (derp_map or derp_map_file)")
	}
	m := new(tailcfg.DERPMap)
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, fmt.Errorf("parsing DERP map: %v", err)
	}
	if len(m.Regions) == 0 {
		return nil, errors.New("DERP map has no regions")
	}
	for id, r := range m.Regions {
		if r == nil || len(r.Nodes) == 0 {
			return nil, fmt.Errorf("DERP region %d has no nodes", id)
		}
		if r.RegionID == 0 {
			r.RegionID = id
		}
		if r.RegionID != id {
			return nil, fmt.Errorf("DERP region key %d has RegionID %d", id, r.RegionID)
		}
	}
	return m, nil
}

// nodeKey loads the node private key from storage, generating and storing it once.
func (a *App) nodeKey(ctx caddy.Context) (key.NodePrivate, error) {
	st := a.storage
	b, err := st.Load(ctx, nodeKeyStorageKey)
	if err == nil {
		var k key.NodePrivate
		if err := k.UnmarshalText(b); err != nil {
			return key.NodePrivate{}, errors.New("decoding stored DERP node key: malformed")
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return key.NodePrivate{}, fmt.Errorf("loading DERP node key: %v", err)
	}
	k := key.NewNode()
	text, _ := k.MarshalText()
	if err := st.Store(ctx, nodeKeyStorageKey, text); err != nil {
		return key.NodePrivate{}, fmt.Errorf("storing DERP node key: %v", err)
	}
	a.logger.Info("generated DERP node key", zap.String("public", k.Public().String()))
	return k, nil
}

type pinRecord struct {
	DERPRegion int `json:"derp_region"`
}

// sharedStorage is implemented by storages that every box of a fleet shares.
type sharedStorage interface{ SharedAcrossBoxes() bool }

// boxStorage picks where this box's node key and pin live; see StorageRaw.
func (a *App) boxStorage(ctx caddy.Context) (certmagic.Storage, error) {
	if a.StorageRaw != nil {
		mod, err := ctx.LoadModule(a, "StorageRaw")
		if err != nil {
			return nil, fmt.Errorf("loading storage: %v", err)
		}
		st, err := mod.(caddy.StorageConverter).CertMagicStorage()
		if err != nil {
			return nil, fmt.Errorf("opening storage: %v", err)
		}
		return st, nil
	}
	st := ctx.Storage()
	if sh, ok := st.(sharedStorage); ok && sh.SharedAcrossBoxes() {
		// Caddy's default file storage: the keys land in <data dir>/derp_switch/.
		dir := caddy.AppDataDir()
		a.logger.Info("Caddy storage is shared between boxes; keeping the DERP node key and pin on this box",
			zap.String("path", filepath.Join(dir, "derp_switch")))
		return &certmagic.FileStorage{Path: dir}, nil
	}
	return st, nil
}

func (a *App) loadPin(ctx caddy.Context) (int, error) {
	b, err := a.storage.Load(ctx, pinStorageKey)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("loading DERP pin: %v", err)
	}
	var p pinRecord
	if err := json.Unmarshal(b, &p); err != nil {
		return 0, fmt.Errorf("decoding DERP pin: %v", err)
	}
	return p.DERPRegion, nil
}

func (a *App) storePin(ctx context.Context, region int) error {
	b, _ := json.Marshal(pinRecord{DERPRegion: region})
	if err := a.storage.Store(ctx, pinStorageKey, b); err != nil {
		return fmt.Errorf("persisting DERP pin: %v", err)
	}
	return nil
}

func derpLogf(l *zap.Logger) func(string, ...any) {
	return func(format string, args ...any) {
		if ce := l.Check(zap.DebugLevel, "derphttp"); ce != nil {
			ce.Write(zap.String("msg", fmt.Sprintf(format, args...)))
		}
	}
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*switcherHandle)(nil)
)
