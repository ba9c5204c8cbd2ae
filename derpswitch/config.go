package derpswitch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"tailscale.com/tailcfg"
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
	// Latency measures each region's latency for autonegotiation. Default: DERP
	// ping/pong round trips on the live connections and on short-lived probe
	// connections (see measureDERPLatency).
	Latency func(ctx context.Context, m *tailcfg.DERPMap) map[int]time.Duration
	// ProbeDial opens the probe connections of the default latency source. Default
	// Dial; the app passes a dialer with a throwaway node key, so a probe is never a
	// second connection of this node on a region's server.
	ProbeDial DialFunc
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
	if c.ProbeDial == nil {
		c.ProbeDial = c.Dial
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
	if c.Dial == nil {
		return errors.New("no dialer")
	}
	return nil
}

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
