// Package derpswitch keeps a box's DERP home connection and switches its home region
// make-before-break: open the target region as an auxiliary connection, prove it,
// swap the home slot, let the old home drain. It is a Go rendering of the "gapless
// forced region switch" design: a negotiator goroutine is the only writer of the
// switch command (target region, generation) and an executor goroutine is the only
// writer of the home slot and connection state. An operator pin (SetOverride) only
// records the override and pokes the negotiator.
package derpswitch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"tailscale.com/derp"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// Mode selects how a pin is applied.
type Mode string

const (
	// ModeMBB applies a pin make-before-break whenever the home connection is alive.
	ModeMBB Mode = "mbb"
	// ModeLegacy tears the home connection down and reconnects to the pin's region
	// (the path the design replaces; kept for comparison runs).
	ModeLegacy Mode = "legacy"
)

// ErrUnknownRegion is returned by SetOverride for a region id not in the DERP map.
var ErrUnknownRegion = errors.New("unknown DERP region")

// ProveConfig is how an auxiliary connection is proven before it becomes the home.
type ProveConfig struct {
	// Count is how many ping/pong round trips must succeed. Default 3.
	Count int
	// Timeout bounds each ping. Default 2 s.
	Timeout time.Duration
	// Interval between pings. Default 100 ms.
	Interval time.Duration
	// ConnectTimeout bounds opening the auxiliary connection. Default 10 s.
	ConnectTimeout time.Duration
}

// Config configures a Switcher.
type Config struct {
	// DERPMap lists the regions. Required.
	DERPMap *tailcfg.DERPMap
	// HomeRegion is the region boot connects to when no pin is set. Required.
	HomeRegion int
	// Override is the persisted pin to boot with (0 = none); boot connects straight to it.
	Override int
	// Mode is ModeMBB (default) or ModeLegacy.
	Mode Mode
	// Prove is the prove gate for auxiliary connections.
	Prove ProveConfig
	// RetryBackoff is the delay before re-issuing a pin whose switch rolled back, one
	// entry per attempt, the last repeating forever. Default 5 s, 15 s, 60 s.
	RetryBackoff []time.Duration
	// Drain is how long an old home stays open after a commit. Default 5 s.
	Drain time.Duration
	// TickInterval is the most time between two negotiator passes. Default 3 s.
	TickInterval time.Duration
	// Autoneg is latency-based autonegotiation (off by default).
	Autoneg AutonegConfig
	// Latency measures each region's latency for autonegotiation. Required when
	// Autoneg.Enabled.
	Latency func(ctx context.Context, m *tailcfg.DERPMap) map[int]time.Duration
	// EchoPrefix: a packet received on any slot that starts with it is answered
	// through the home connection with EchoReplyPrefix in its place. Empty disables echo.
	EchoPrefix []byte
	// EchoReplyPrefix replaces EchoPrefix in the answer (so two boxes never echo each
	// other forever). Default "lchat-echo-reply:".
	EchoReplyPrefix []byte
	// OnCommit is the re-advertise hook, called (on the executor) after the home moved.
	OnCommit func(region int)

	Dial   DialFunc
	Clock  Clock
	Logger *zap.Logger
}

func (c *Config) setDefaults() {
	if c.Mode == "" {
		c.Mode = ModeMBB
	}
	if c.Prove.Count <= 0 {
		c.Prove.Count = 3
	}
	if c.Prove.Timeout <= 0 {
		c.Prove.Timeout = 2 * time.Second
	}
	if c.Prove.Interval <= 0 {
		c.Prove.Interval = 100 * time.Millisecond
	}
	if c.Prove.ConnectTimeout <= 0 {
		c.Prove.ConnectTimeout = 10 * time.Second
	}
	if len(c.RetryBackoff) == 0 {
		c.RetryBackoff = []time.Duration{5 * time.Second, 15 * time.Second, 60 * time.Second}
	}
	if c.Drain <= 0 {
		c.Drain = 5 * time.Second
	}
	if c.TickInterval <= 0 {
		c.TickInterval = 3 * time.Second
	}
	if len(c.EchoReplyPrefix) == 0 {
		c.EchoReplyPrefix = []byte("lchat-echo-reply:")
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	c.Autoneg.setDefaults()
}

// Validate checks a Config.
func (c *Config) Validate() error {
	if c.DERPMap == nil || len(c.DERPMap.Regions) == 0 {
		return errors.New("DERP map has no regions")
	}
	if c.DERPMap.Regions[c.HomeRegion] == nil {
		return fmt.Errorf("home region %d: %w", c.HomeRegion, ErrUnknownRegion)
	}
	if c.Mode != "" && c.Mode != ModeMBB && c.Mode != ModeLegacy {
		return fmt.Errorf("mode %q: want %q or %q", c.Mode, ModeMBB, ModeLegacy)
	}
	for _, d := range c.RetryBackoff {
		if d <= 0 {
			return fmt.Errorf("retry backoff %v: every entry must be positive", d)
		}
	}
	if c.Autoneg.Enabled && c.Latency == nil {
		return errors.New("autonegotiation needs a latency source")
	}
	if c.Dial == nil {
		return errors.New("no dialer")
	}
	return nil
}

// CmdKind is what a switch command asks of the executor.
type CmdKind int

const (
	// CmdNone: nothing to do; a new generation of it cancels an in-flight switch.
	CmdNone CmdKind = iota
	// CmdMBB: move the home make-before-break.
	CmdMBB
	// CmdRehome: tear down and connect the target directly (cold path, legacy mode).
	CmdRehome
)

func (k CmdKind) String() string {
	switch k {
	case CmdMBB:
		return "mbb"
	case CmdRehome:
		return "rehome"
	}
	return "none"
}

// Command is the switch command. Its only writer is the negotiator.
type Command struct {
	Kind       CmdKind
	Target     int
	Generation uint64
	Source     string // "pin" or "autoneg"
}

type outcomeKind int

const (
	outcomeCommitted outcomeKind = iota
	outcomeRolledBack
	outcomeAborted
)

type outcome struct {
	kind outcomeKind
	cmd  Command
}

// Switch states, as reported in Status.
const (
	StateIdle       = "idle"
	StateAuxOpening = "aux_opening"
	StateProving    = "proving"
	StateRehoming   = "rehoming"
)

// Counters are the switch counters (monotonic since the Switcher started).
type Counters struct {
	PinMBBRequests uint64 `json:"pin_mbb_requests"`
	PinMBBCommits  uint64 `json:"pin_mbb_commits"`
	PinMBBRetries  uint64 `json:"pin_mbb_retries"`
	DERPReconnects uint64 `json:"derp_reconnects"`
	RehomeApplied  uint64 `json:"rehome_applied"`
	Rollbacks      uint64 `json:"rollbacks"`
	MBBCommits     uint64 `json:"mbb_commits"`
	EchoReplies    uint64 `json:"echo_replies"`
}

type counters struct {
	pinMBBRequests, pinMBBCommits, pinMBBRetries atomic.Uint64
	derpReconnects, rehomeApplied, rollbacks     atomic.Uint64
	mbbCommits, echoReplies                      atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		PinMBBRequests: c.pinMBBRequests.Load(),
		PinMBBCommits:  c.pinMBBCommits.Load(),
		PinMBBRetries:  c.pinMBBRetries.Load(),
		DERPReconnects: c.derpReconnects.Load(),
		RehomeApplied:  c.rehomeApplied.Load(),
		Rollbacks:      c.rollbacks.Load(),
		MBBCommits:     c.mbbCommits.Load(),
		EchoReplies:    c.echoReplies.Load(),
	}
}

// Slot roles.
const (
	RoleHome     = "home"
	RoleAux      = "aux"
	RoleDraining = "draining"
)

// slot is one connection to one region.
type slot struct {
	sw     *Switcher
	region int
	conn   Conn

	// role and drainUntil are written by the executor only; role is read by Status.
	role       atomic.Value // string
	drainUntil time.Time

	connected atomic.Bool // written by the slot's recv loop (and the op that connects it)
	closed    atomic.Bool
	recvOnce  sync.Once
}

func (s *slot) getRole() string { r, _ := s.role.Load().(string); return r }

// Switcher is the region-switch engine. Start runs it; Close stops it.
type Switcher struct {
	// logp is the current config's logger (a reload may bring another).
	logp  atomic.Pointer[zap.Logger]
	clock Clock
	dial  DialFunc
	ctr   counters

	cfgMu sync.Mutex
	// cfg is replaced by Reconfigure; readers copy it under cfgMu.
	cfg Config

	derpMap atomic.Pointer[tailcfg.DERPMap]

	// override is the operator pin. Writers: SetOverride, and the executor's map
	// reconcile when the pinned region leaves the DERP map.
	override atomic.Int64
	pokeCh   chan struct{}
	// overrideCh tells the executor the override changed (for I2').
	overrideCh chan struct{}

	cmdMu sync.Mutex
	// cmd is written by the negotiator only.
	cmd   Command
	cmdCh chan struct{}

	outcomeCh chan outcome
	mapCh     chan *tailcfg.DERPMap

	// homePtr publishes the executor's home slot to the data plane and negotiator.
	homePtr atomic.Pointer[slot]

	stMu sync.Mutex
	// The fields below are written by the executor (slots, state) or negotiator
	// (pin retry, autoneg) and read by Status under stMu.
	slots       []*slot
	state       string
	pinRetryAt  time.Time
	pinRetryN   int
	autonegNote string
	latencies   map[int]time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // negotiator, executor, latency
	recvWG sync.WaitGroup // slot receive loops
	once   sync.Once
}

// New returns a Switcher for cfg. It connects nothing until Start.
func New(cfg Config) (*Switcher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Override != 0 && cfg.DERPMap.Regions[cfg.Override] == nil {
		return nil, fmt.Errorf("persisted pin %d: %w", cfg.Override, ErrUnknownRegion)
	}
	s := &Switcher{
		clock:      cfg.Clock,
		dial:       cfg.Dial,
		cfg:        cfg,
		pokeCh:     make(chan struct{}, 1),
		overrideCh: make(chan struct{}, 1),
		cmdCh:      make(chan struct{}, 1),
		outcomeCh:  make(chan outcome, 16),
		mapCh:      make(chan *tailcfg.DERPMap, 1),
		state:      StateIdle,
	}
	s.logp.Store(cfg.Logger)
	s.derpMap.Store(cfg.DERPMap)
	s.override.Store(int64(cfg.Override))
	return s, nil
}

func (s *Switcher) logger() *zap.Logger { return s.logp.Load() }

func (s *Switcher) config() Config {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	return s.cfg
}

// Start connects the boot home (the persisted pin if any, else the home region) and
// starts the negotiator and executor.
func (s *Switcher) Start() {
	s.ctx, s.cancel = context.WithCancel(context.Background())
	boot := s.cfg.HomeRegion
	if ov := int(s.override.Load()); ov != 0 {
		boot = ov
	}
	safego.Go(&s.wg, s.logger(), "executor", func() { s.runExecutor(boot) })
	safego.Go(&s.wg, s.logger(), "negotiator", s.runNegotiator)
	safego.Go(&s.wg, s.logger(), "latency", s.runLatency)
}

// Close stops the goroutines and closes every connection. It is idempotent.
func (s *Switcher) Close() error {
	s.once.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
		s.wg.Wait()
		s.stMu.Lock()
		slots := s.slots
		s.slots = nil
		s.stMu.Unlock()
		for _, sl := range slots {
			sl.close()
		}
		s.recvWG.Wait()
	})
	return nil
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// SetOverride records the operator pin (0 clears it) and pokes the negotiator. It
// never touches connections: the negotiator decides how the pin is applied.
func (s *Switcher) SetOverride(region int) error {
	if region < 0 {
		return fmt.Errorf("region %d: %w", region, ErrUnknownRegion)
	}
	if region != 0 && s.derpMap.Load().Regions[region] == nil {
		return fmt.Errorf("region %d: %w", region, ErrUnknownRegion)
	}
	s.override.Store(int64(region))
	poke(s.overrideCh)
	poke(s.pokeCh)
	return nil
}

// Override returns the current pin (0 = none).
func (s *Switcher) Override() int { return int(s.override.Load()) }

// HasRegion reports whether region is in the current DERP map.
func (s *Switcher) HasRegion(region int) bool {
	return s.derpMap.Load().Regions[region] != nil
}

// Reconfigure applies a new configuration to a running Switcher (a Caddy reload).
// Connections to regions whose definition is unchanged are kept; the executor
// reconciles the rest.
func (s *Switcher) Reconfigure(cfg Config) error {
	cur := s.config()
	cfg.Dial, cfg.Clock = cur.Dial, cur.Clock
	if cfg.Latency == nil {
		cfg.Latency = cur.Latency
	}
	if cfg.Logger == nil {
		cfg.Logger = cur.Logger
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.cfgMu.Lock()
	s.cfg = cfg
	s.cfgMu.Unlock()
	s.logp.Store(cfg.Logger)
	old := s.derpMap.Swap(cfg.DERPMap)
	if !derpMapEqual(old, cfg.DERPMap) {
		select {
		case <-s.mapCh:
		default:
		}
		s.mapCh <- cfg.DERPMap
	}
	poke(s.pokeCh)
	return nil
}

func (s *Switcher) regionFunc(region int) func() *tailcfg.DERPRegion {
	return func() *tailcfg.DERPRegion { return s.derpMap.Load().Regions[region] }
}

// liveHome returns the home slot's region and whether its connection is up.
func (s *Switcher) liveHome() (region int, alive bool) {
	h := s.homePtr.Load()
	if h == nil {
		return 0, false
	}
	return h.region, h.connected.Load()
}

// ---- negotiator ----

type negotiator struct {
	s       *Switcher
	cmd     Command
	settled bool
	lastOv  int
	retryAt time.Time
	retryN  int
	damper  *Damper
	// damperCfg is the config damper was built with.
	damperCfg AutonegConfig
}

func (s *Switcher) issue(n *negotiator, kind CmdKind, target int, source string) Command {
	n.cmd = Command{Kind: kind, Target: target, Generation: n.cmd.Generation + 1, Source: source}
	n.settled = kind == CmdNone
	s.cmdMu.Lock()
	s.cmd = n.cmd
	s.cmdMu.Unlock()
	poke(s.cmdCh)
	return n.cmd
}

func (s *Switcher) loadCmd() Command {
	s.cmdMu.Lock()
	defer s.cmdMu.Unlock()
	return s.cmd
}

func (s *Switcher) runNegotiator() {
	n := &negotiator{s: s, settled: true, damper: NewDamper(s.config().Autoneg), damperCfg: s.config().Autoneg}
	n.lastOv = int(s.override.Load())
	for {
		cfg := s.config()
		wait := cfg.TickInterval
		// The retry deadline matters only while no command is in flight: once the retry
		// is issued its deadline is past, and waiting on it would spin the loop for the
		// whole connect and prove.
		if n.settled && !n.retryAt.IsZero() {
			if d := n.retryAt.Sub(s.clock.Now()); d < wait {
				wait = d
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.pokeCh:
		case o := <-s.outcomeCh:
			n.consume(o)
		case <-s.clock.After(wait):
		}
		// Drain outcomes that arrived together so evaluate sees the latest.
		for more := true; more; {
			select {
			case o := <-s.outcomeCh:
				n.consume(o)
			default:
				more = false
			}
		}
		n.evaluate()
	}
}

func (n *negotiator) consume(o outcome) {
	s := n.s
	if o.cmd.Generation != n.cmd.Generation {
		return // a stale result of a preempted command
	}
	n.settled = true
	now := s.clock.Now()
	ov := int(s.override.Load())
	switch o.kind {
	case outcomeCommitted:
		n.retryAt, n.retryN = time.Time{}, 0
		s.setRetry(time.Time{}, 0)
		if o.cmd.Kind == CmdMBB {
			n.damper.NoteHomeChange(now, o.cmd.Source == "autoneg")
		}
	case outcomeRolledBack:
		if ov != 0 && o.cmd.Target == ov {
			// A pin is a command, not advice: never ban, retry with backoff forever.
			backoff := s.config().RetryBackoff
			d := backoff[min(n.retryN, len(backoff)-1)]
			n.retryN++
			n.retryAt = now.Add(d)
			s.setRetry(n.retryAt, n.retryN)
			s.logger().Warn("pin MBB rolled back; old home keeps serving, retry scheduled",
				zap.Int("target_region", o.cmd.Target), zap.Uint64("generation", o.cmd.Generation),
				zap.Duration("retry_in", d), zap.Int("attempt", n.retryN))
		} else if o.cmd.Source == "autoneg" {
			n.damper.Ban(now, o.cmd.Target)
			s.logger().Info("autonegotiated switch rolled back; region banned",
				zap.Int("region", o.cmd.Target), zap.Duration("ban", s.config().Autoneg.BanDuration))
		}
	}
}

func (s *Switcher) setRetry(at time.Time, n int) {
	s.stMu.Lock()
	s.pinRetryAt, s.pinRetryN = at, n
	s.stMu.Unlock()
}

func (n *negotiator) evaluate() {
	s := n.s
	cfg := s.config()
	now := s.clock.Now()
	ov := int(s.override.Load())
	if ov != n.lastOv {
		// A new or changed pin starts a fresh retry schedule.
		n.lastOv, n.retryAt, n.retryN = ov, time.Time{}, 0
		s.setRetry(time.Time{}, 0)
	}
	homeRegion, alive := s.liveHome()

	if ov != 0 {
		if h := s.homePtr.Load(); h != nil && h.region == ov && !n.retryAt.IsZero() {
			// The home slot is on the pin already (a map reconcile rehomed it there):
			// nothing is left to retry, and a stale deadline would spin the loop.
			n.retryAt, n.retryN = time.Time{}, 0
			s.setRetry(time.Time{}, 0)
		}
		if alive && homeRegion == ov {
			if !n.settled && n.cmd.Target != ov {
				s.issue(n, CmdNone, 0, "pin")
			}
			return
		}
		if alive && cfg.Mode == ModeMBB {
			if !n.settled && n.cmd.Kind == CmdMBB && n.cmd.Target == ov {
				return // already in flight toward the pin: let it run
			}
			if !n.retryAt.IsZero() {
				if now.Before(n.retryAt) {
					return
				}
				c := s.issue(n, CmdMBB, ov, "pin")
				s.ctr.pinMBBRetries.Add(1)
				s.logger().Info("pin MBB retry", zap.Int("from_region", homeRegion),
					zap.Int("target_region", ov), zap.Uint64("generation", c.Generation),
					zap.Int("attempt", n.retryN))
				return
			}
			c := s.issue(n, CmdMBB, ov, "pin")
			s.ctr.pinMBBRequests.Add(1)
			s.logger().Info("PIN via MBB (gapless; old home drains)", zap.Int("from_region", homeRegion),
				zap.Int("target_region", ov), zap.Uint64("generation", c.Generation))
			return
		}
		// No live home (nothing to protect) or legacy mode: rehome directly.
		if h := s.homePtr.Load(); h != nil && h.region == ov {
			return // the home slot already points at the pin and is (re)connecting
		}
		if !n.settled && n.cmd.Kind == CmdRehome && n.cmd.Target == ov {
			return
		}
		c := s.issue(n, CmdRehome, ov, "pin")
		s.logger().Info("pin applied by direct rehome", zap.Int("target_region", ov),
			zap.Bool("home_alive", alive), zap.String("mode", string(cfg.Mode)),
			zap.Uint64("generation", c.Generation))
		return
	}

	if !n.settled && n.cmd.Source == "pin" {
		c := s.issue(n, CmdNone, 0, "pin")
		s.logger().Info("pin cleared; cancelling pin-sourced switch", zap.Uint64("generation", c.Generation))
		return
	}
	if !cfg.Autoneg.Enabled || !alive || !n.settled {
		return
	}
	if n.damperCfg != cfg.Autoneg {
		// A reload changed the damping: start its windows afresh.
		n.damper, n.damperCfg = NewDamper(cfg.Autoneg), cfg.Autoneg
	}
	s.stMu.Lock()
	lat := s.latencies
	s.stMu.Unlock()
	target := n.damper.Decide(now, homeRegion, lat)
	s.stMu.Lock()
	s.autonegNote = n.damper.Reason
	s.stMu.Unlock()
	if target == 0 {
		return
	}
	c := s.issue(n, CmdMBB, target, "autoneg")
	s.logger().Info("autonegotiated switch via MBB", zap.Int("from_region", homeRegion),
		zap.Int("target_region", target), zap.Duration("home_latency", lat[homeRegion]),
		zap.Duration("target_latency", lat[target]), zap.Uint64("generation", c.Generation))
}

func (s *Switcher) runLatency() {
	for {
		cfg := s.config()
		if cfg.Autoneg.Enabled && cfg.Latency != nil {
			ctx, cancel := context.WithTimeout(s.ctx, cfg.Autoneg.Interval)
			lat := cfg.Latency(ctx, s.derpMap.Load())
			cancel()
			s.stMu.Lock()
			s.latencies = lat
			s.stMu.Unlock()
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.clock.After(cfg.Autoneg.Interval):
		}
	}
}

// ---- executor ----

type op struct {
	cmd    Command
	aux    *slot
	cancel context.CancelFunc
	done   chan error
	start  time.Time
}

func (s *Switcher) newSlot(region int, role string) *slot {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	sl := &slot{sw: s, region: region, conn: s.dial(s.regionFunc(region))}
	sl.role.Store(role)
	s.slots = append(s.slots, sl)
	return sl
}

func (s *Switcher) removeSlot(sl *slot) {
	s.stMu.Lock()
	for i, x := range s.slots {
		if x == sl {
			s.slots = append(s.slots[:i:i], s.slots[i+1:]...)
			break
		}
	}
	s.stMu.Unlock()
	sl.close()
}

func (sl *slot) close() {
	if sl.closed.Swap(true) {
		return
	}
	sl.connected.Store(false)
	sl.conn.Close()
}

func (s *Switcher) setState(st string) {
	s.stMu.Lock()
	s.state = st
	s.stMu.Unlock()
}

// setHome makes sl the home slot. Executor only.
func (s *Switcher) setHome(sl *slot) {
	old := s.homePtr.Swap(sl)
	sl.role.Store(RoleHome)
	sl.conn.NotePreferred(true)
	if old != nil && old != sl {
		old.conn.NotePreferred(false)
	}
}

func (s *Switcher) runExecutor(boot int) {
	home := s.newSlot(boot, RoleHome)
	s.setHome(home)
	home.startRecv()
	s.logger().Info("boot: connecting home region", zap.Int("region", boot))

	var cur *op
	var lastGen uint64
	for {
		var drainC <-chan time.Time
		if d, ok := s.nextDrain(); ok {
			drainC = s.clock.After(d)
		}
		var opDone chan error
		if cur != nil {
			opDone = cur.done
		}
		select {
		case <-s.ctx.Done():
			if cur != nil {
				cur.cancel()
				<-cur.done
			}
			return
		case <-s.cmdCh:
			cmd := s.loadCmd()
			if cmd.Generation == lastGen {
				continue
			}
			lastGen = cmd.Generation
			if cur != nil {
				// Generation preemption: the newer command wins.
				s.abortOp(cur, "preempted by generation", cmd.Generation)
				cur = nil
			}
			cur = s.startCommand(cmd)
		case <-s.overrideCh:
			// I2': an override aborts an in-flight switch only if it names another region.
			if cur != nil {
				if ov := int(s.override.Load()); ov != 0 && ov != cur.cmd.Target {
					s.abortOp(cur, "override names another region (I2')", 0)
					cur = nil
				}
			}
		case err := <-opDone:
			s.finishOp(cur, err)
			cur = nil
		case <-drainC:
			s.expireDrains()
		case m := <-s.mapCh:
			if s.reconcile(m, cur) {
				cur = nil
			}
		}
	}
}

func (s *Switcher) nextDrain() (time.Duration, bool) {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	var earliest time.Time
	for _, sl := range s.slots {
		if sl.getRole() == RoleDraining && (earliest.IsZero() || sl.drainUntil.Before(earliest)) {
			earliest = sl.drainUntil
		}
	}
	if earliest.IsZero() {
		return 0, false
	}
	return earliest.Sub(s.clock.Now()), true
}

func (s *Switcher) expireDrains() {
	now := s.clock.Now()
	s.stMu.Lock()
	var expired []*slot
	for _, sl := range s.slots {
		if sl.getRole() == RoleDraining && !now.Before(sl.drainUntil) {
			expired = append(expired, sl)
		}
	}
	s.stMu.Unlock()
	for _, sl := range expired {
		s.logger().Info("old home drained; closing", zap.Int("region", sl.region))
		s.removeSlot(sl)
	}
}

func (s *Switcher) report(kind outcomeKind, cmd Command) {
	select {
	case s.outcomeCh <- outcome{kind: kind, cmd: cmd}:
	case <-s.ctx.Done():
	}
}

func (s *Switcher) startCommand(cmd Command) *op {
	cfg := s.config()
	switch cmd.Kind {
	case CmdNone:
		s.setState(StateIdle)
		return nil
	case CmdRehome:
		s.rehome(cmd.Target, cmd)
		s.report(outcomeCommitted, cmd)
		return nil
	}
	home := s.homePtr.Load()
	// "Already effective" compares the LIVE home connection's region.
	if home != nil && home.region == cmd.Target && home.connected.Load() {
		s.setState(StateIdle)
		s.report(outcomeCommitted, cmd)
		return nil
	}
	// Reuse a connection to the target that is draining (or a leftover aux).
	var aux *slot
	s.stMu.Lock()
	for _, sl := range s.slots {
		if sl.region == cmd.Target && sl != home && !sl.closed.Load() {
			aux = sl
			break
		}
	}
	s.stMu.Unlock()
	if aux == nil {
		aux = s.newSlot(cmd.Target, RoleAux)
	} else {
		aux.role.Store(RoleAux)
	}
	from := 0
	if home != nil {
		from = home.region
	}
	s.setState(StateAuxOpening)
	s.logger().Info("MBB AUX_OPENING", zap.Int("from_region", from), zap.Int("target_region", cmd.Target),
		zap.Uint64("generation", cmd.Generation), zap.String("source", cmd.Source))
	ctx, cancel := context.WithCancel(s.ctx)
	o := &op{cmd: cmd, aux: aux, cancel: cancel, done: make(chan error, 1), start: time.Now()}
	prove := cfg.Prove
	go func() {
		err := errors.New("prove panicked")
		safego.Run(s.logger(), "prove aux", func() { err = s.proveAux(ctx, aux, prove) })
		o.done <- err
	}()
	return o
}

// proveAux opens aux and proves it with ping/pong round trips. It runs on its own
// goroutine and touches only aux's connection.
func (s *Switcher) proveAux(ctx context.Context, aux *slot, p ProveConfig) error {
	cctx, cancel := context.WithTimeout(ctx, p.ConnectTimeout)
	err := aux.conn.Connect(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("opening aux: %w", err)
	}
	aux.connected.Store(true)
	aux.startRecv()
	s.setState(StateProving)
	for i := 0; i < p.Count; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(p.Interval):
			}
		}
		pctx, cancel := context.WithTimeout(ctx, p.Timeout)
		err := aux.conn.Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("proving aux (ping %d/%d): %w", i+1, p.Count, err)
		}
	}
	return nil
}

// abortOp cancels an in-flight op, waits for its prove goroutine and drops it.
func (s *Switcher) abortOp(o *op, why string, byGen uint64) {
	o.cancel()
	<-o.done
	s.dropOp(o, why, byGen)
}

// dropOp closes a finished op's aux connection and reports the op aborted.
func (s *Switcher) dropOp(o *op, why string, byGen uint64) {
	if o.aux != s.homePtr.Load() {
		s.removeSlot(o.aux)
	}
	s.setState(StateIdle)
	s.logger().Info("MBB aborted", zap.Int("target_region", o.cmd.Target),
		zap.Uint64("generation", o.cmd.Generation), zap.Uint64("by_generation", byGen),
		zap.String("reason", why))
	s.report(outcomeAborted, o.cmd)
}

// finishOp ends an op whose prove returned err: a rollback, or the commit that makes
// the aux the home and drains the old one.
func (s *Switcher) finishOp(o *op, err error) {
	cfg := s.config()
	o.cancel()
	if ov := int(s.override.Load()); err == nil && ov != 0 && ov != o.cmd.Target {
		s.dropOp(o, "override names another region (I2')", 0)
		return
	}
	if err != nil {
		s.removeSlot(o.aux)
		s.ctr.rollbacks.Add(1)
		s.setState(StateIdle)
		home := s.homePtr.Load()
		homeRegion := 0
		if home != nil {
			homeRegion = home.region
		}
		s.logger().Warn("MBB ROLLBACK: target not proven; old home keeps serving",
			zap.Int("target_region", o.cmd.Target), zap.Int("home_region", homeRegion),
			zap.Uint64("generation", o.cmd.Generation), zap.String("source", o.cmd.Source),
			zap.Error(err))
		s.report(outcomeRolledBack, o.cmd)
		return
	}
	old := s.homePtr.Load()
	s.setHome(o.aux)
	now := s.clock.Now()
	fromRegion := 0
	if old != nil && old != o.aux {
		fromRegion = old.region
		old.drainUntil = now.Add(cfg.Drain)
		old.role.Store(RoleDraining)
	}
	s.ctr.mbbCommits.Add(1)
	if ov := int(s.override.Load()); ov != 0 && ov == o.cmd.Target {
		s.ctr.pinMBBCommits.Add(1)
	}
	s.setState(StateIdle)
	s.logger().Info("MBB COMMIT (no teardown)", zap.Int("from_region", fromRegion),
		zap.Int("target_region", o.cmd.Target), zap.Uint64("generation", o.cmd.Generation),
		zap.String("source", o.cmd.Source), zap.Duration("took", time.Since(o.start)))
	if cfg.OnCommit != nil {
		cfg.OnCommit(o.cmd.Target)
	}
	s.report(outcomeCommitted, o.cmd)
}

// rehome tears the home down and connects region directly (cold path, legacy mode,
// map reconcile). Executor only.
func (s *Switcher) rehome(region int, cmd Command) {
	old := s.homePtr.Load()
	s.setState(StateRehoming)
	if old != nil {
		s.homePtr.Store(nil)
		s.removeSlot(old)
	}
	// Drop any aux or draining slot to the target: the new home owns that region now.
	s.stMu.Lock()
	var drop []*slot
	for _, sl := range s.slots {
		if sl.region == region {
			drop = append(drop, sl)
		}
	}
	s.stMu.Unlock()
	for _, sl := range drop {
		s.removeSlot(sl)
	}
	home := s.newSlot(region, RoleHome)
	s.setHome(home)
	home.startRecv()
	s.ctr.rehomeApplied.Add(1)
	s.ctr.derpReconnects.Add(1)
	s.setState(StateIdle)
	oldRegion := 0
	if old != nil {
		oldRegion = old.region
	}
	s.logger().Info("DERP reconnect requested (teardown rehome)", zap.Int("from_region", oldRegion),
		zap.Int("target_region", region), zap.Uint64("generation", cmd.Generation),
		zap.String("source", cmd.Source))
	if cfg := s.config(); cfg.OnCommit != nil {
		cfg.OnCommit(region)
	}
}

// reconcile applies a changed DERP map; it reports whether it aborted cur.
func (s *Switcher) reconcile(m *tailcfg.DERPMap, cur *op) (aborted bool) {
	s.stMu.Lock()
	slots := append([]*slot(nil), s.slots...)
	s.stMu.Unlock()
	home := s.homePtr.Load()
	for _, sl := range slots {
		if sl == home || (cur != nil && sl == cur.aux) {
			continue
		}
		if m.Regions[sl.region] == nil {
			s.removeSlot(sl)
		}
	}
	if cur != nil && m.Regions[cur.cmd.Target] == nil {
		s.abortOp(cur, "region removed from DERP map", 0)
		aborted = true
	}
	if home != nil && m.Regions[home.region] == nil {
		target := s.config().HomeRegion
		if ov := int(s.override.Load()); ov != 0 && m.Regions[ov] != nil {
			target = ov
		}
		s.logger().Warn("home region removed from DERP map; rehoming", zap.Int("region", home.region),
			zap.Int("target_region", target))
		s.rehome(target, Command{Source: "reconcile"})
	}
	if ov := int(s.override.Load()); ov != 0 && m.Regions[ov] == nil {
		s.logger().Warn("pinned region no longer in DERP map; clearing pin", zap.Int("region", ov))
		s.override.Store(0)
	}
	poke(s.pokeCh)
	return aborted
}

// startRecv starts the slot's receive loop once. The loop reconnects implicitly
// (derphttp) when the connection breaks, until the slot is closed.
func (sl *slot) startRecv() {
	sl.recvOnce.Do(func() {
		safego.Go(&sl.sw.recvWG, sl.sw.logger(), "recv loop", sl.recvLoop)
	})
}

func (sl *slot) recvLoop() {
	s := sl.sw
	lastGen := 0
	backoff := 100 * time.Millisecond
	for {
		if sl.closed.Load() || s.ctx.Err() != nil {
			return
		}
		m, gen, err := sl.conn.RecvDetail()
		if err != nil {
			if sl.closed.Load() || s.ctx.Err() != nil {
				return
			}
			wasUp := sl.connected.Swap(false)
			if wasUp && s.homePtr.Load() == sl {
				s.logger().Warn("home DERP connection lost", zap.Int("region", sl.region), zap.Error(err))
				poke(s.pokeCh)
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if gen != lastGen {
			if lastGen != 0 && s.homePtr.Load() == sl {
				s.ctr.derpReconnects.Add(1)
				s.logger().Info("home DERP connection re-established", zap.Int("region", sl.region),
					zap.Int("conn_gen", gen))
			}
			lastGen = gen
			if !sl.connected.Swap(true) && s.homePtr.Load() == sl {
				poke(s.pokeCh)
			}
		}
		switch m := m.(type) {
		case derp.ReceivedPacket:
			s.handlePacket(m.Source, m.Data)
		case derp.PingMessage:
			sl.conn.SendPong(m)
		}
	}
}

// handlePacket answers echo requests through the home connection, whichever slot
// received them.
func (s *Switcher) handlePacket(src key.NodePublic, data []byte) {
	s.cfgMu.Lock()
	prefix, reply := s.cfg.EchoPrefix, s.cfg.EchoReplyPrefix
	s.cfgMu.Unlock()
	if len(prefix) == 0 || !bytes.HasPrefix(data, prefix) {
		return
	}
	home := s.homePtr.Load()
	if home == nil || !home.connected.Load() {
		return
	}
	out := make([]byte, 0, len(reply)+len(data)-len(prefix))
	out = append(append(out, reply...), data[len(prefix):]...)
	if err := home.conn.Send(src, out); err == nil {
		s.ctr.echoReplies.Add(1)
	}
}

// ---- status ----

// SlotStatus describes one connection slot.
type SlotStatus struct {
	Region    int    `json:"region"`
	Role      string `json:"role"`
	Connected bool   `json:"connected"`
}

// SwitchStatus is the switch command and the executor's state.
type SwitchStatus struct {
	State      string `json:"state"`
	Kind       string `json:"kind,omitempty"`
	Target     int    `json:"target"`
	Generation uint64 `json:"generation"`
	Source     string `json:"source,omitempty"`
}

// Status is the switcher's state as reported by the admin endpoint.
type Status struct {
	Mode          Mode         `json:"mode"`
	HomeRegion    int          `json:"home_region"`
	HomeConnected bool         `json:"home_connected"`
	EffectiveHome int          `json:"effective_home"`
	Override      int          `json:"override"`
	PinPending    bool         `json:"pin_pending"`
	PinRetries    int          `json:"pin_retry_attempt,omitempty"`
	PinRetryIn    string       `json:"pin_retry_in,omitempty"`
	Switch        SwitchStatus `json:"switch"`
	Slots         []SlotStatus `json:"slots"`
	Autoneg       string       `json:"autoneg,omitempty"`
	Counters
}

// Status returns a snapshot.
func (s *Switcher) Status() Status {
	cfg := s.config()
	st := Status{Mode: cfg.Mode, Override: int(s.override.Load()), Counters: s.ctr.snapshot()}
	st.HomeRegion, st.HomeConnected = s.liveHome()
	st.EffectiveHome = st.HomeRegion
	if st.Override != 0 {
		st.EffectiveHome = st.Override
	}
	st.PinPending = st.Override != 0 && !(st.HomeConnected && st.HomeRegion == st.Override)
	cmd := s.loadCmd()
	st.Switch = SwitchStatus{Kind: cmd.Kind.String(), Target: cmd.Target, Generation: cmd.Generation, Source: cmd.Source}
	s.stMu.Lock()
	st.Switch.State = s.state
	if !s.pinRetryAt.IsZero() {
		st.PinRetries = s.pinRetryN
		st.PinRetryIn = max(0, s.pinRetryAt.Sub(s.clock.Now())).Round(time.Millisecond).String()
	}
	if cfg.Autoneg.Enabled {
		st.Autoneg = s.autonegNote
		if st.Autoneg == "" {
			st.Autoneg = "enabled"
		}
	}
	for _, sl := range s.slots {
		st.Slots = append(st.Slots, SlotStatus{Region: sl.region, Role: sl.getRole(), Connected: sl.connected.Load()})
	}
	s.stMu.Unlock()
	sort.SliceStable(st.Slots, func(i, j int) bool { return st.Slots[i].Role == RoleHome && st.Slots[j].Role != RoleHome })
	return st
}

// Counters returns the counters.
func (s *Switcher) Counters() Counters { return s.ctr.snapshot() }

func derpMapEqual(a, b *tailcfg.DERPMap) bool {
	if a == nil || b == nil {
		return a == b
	}
	if len(a.Regions) != len(b.Regions) {
		return false
	}
	for id, ra := range a.Regions {
		rb := b.Regions[id]
		if rb == nil || !regionEqual(ra, rb) {
			return false
		}
	}
	return true
}

func regionEqual(a, b *tailcfg.DERPRegion) bool {
	if a.RegionID != b.RegionID || a.RegionCode != b.RegionCode || len(a.Nodes) != len(b.Nodes) {
		return false
	}
	for i := range a.Nodes {
		if *a.Nodes[i] != *b.Nodes[i] {
			return false
		}
	}
	return true
}
