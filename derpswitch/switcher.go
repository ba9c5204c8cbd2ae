// Package derpswitch keeps a box's DERP home connection and switches its home region
// make-before-break: open the target region as an auxiliary connection, prove it,
// swap the home slot, let the old home drain. It is a Go rendering of the "gapless
// forced region switch" design: a negotiator goroutine is the only writer of the
// switch command (target region, generation) and an executor goroutine is the only
// writer of the home slot and connection state. An operator pin (SetOverride) only
// records the override and pokes the negotiator.
package derpswitch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
	"go.uber.org/zap"
	"tailscale.com/tailcfg"
)

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
	if cfg.ProbeDial == nil {
		cfg.ProbeDial = cur.ProbeDial
	}
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
	if ov := s.override.Load(); ov != 0 && cfg.DERPMap.Regions[int(ov)] == nil && s.override.CompareAndSwap(ov, 0) {
		// Cleared here, before the executor reconciles the map, so that no switch
		// toward the region can commit in between (the executor checks the pin).
		s.logger().Warn("pinned region no longer in DERP map; clearing pin", zap.Int64("region", ov))
		poke(s.overrideCh)
	}
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
