package gate

import (
	"slices"
	"time"
)

// statsWindow is how many recent waits the percentiles of Stats cover.
const statsWindow = 1024

// Stats is a snapshot of a Gate's counters.
type Stats struct {
	// Waits counts the Waits that have returned, released or failed.
	Waits uint64
	// Failed counts those that returned an error (ErrNotDurable): answers turned away.
	Failed uint64
	// WaitP50 and WaitP99 are percentiles of how long the last statsWindow (1024) queued
	// waits were held, failed ones included (an answer refused was held that long too); a
	// Wait that returned at once (a closed gate, an ended ctx) is counted above but not
	// here. Zero before any.
	WaitP50, WaitP99 time.Duration
	// Ships counts the Ship calls that returned; ShipErrors those that failed.
	Ships, ShipErrors uint64
	// Waiting is how many waiters are held now.
	Waiting int
	// Lag is the durable lag: how long the oldest waiter held now has waited; 0 with none.
	Lag time.Duration
	// Landing is how many shipments are cut and not landed now; LandTime how long recent
	// ones took from their cut to landed (a moving average; 0 before the first).
	Landing  int
	LandTime time.Duration
	// Closed is why the gate is closed (a Ship's ErrFenced, ErrClosed, Close's error);
	// nil while it is open.
	Closed error
}

// counters are a Gate's figures, guarded by its mu.
type counters struct {
	waits, failed     uint64
	ships, shipErrors uint64
	recent            [statsWindow]time.Duration // a ring of the last waits' durations
	recorded          int                        // waits put in recent, ever
}

// waited records a queued wait that ended after d, released (ok) or failed.
func (c *counters) waited(d time.Duration, ok bool) {
	c.waits++
	if !ok {
		c.failed++
	}
	c.recent[c.recorded%statsWindow] = d
	c.recorded++
}

// noWait records a Wait that failed without queuing.
func (c *counters) noWait() {
	c.waits++
	c.failed++
}

// percentiles are the nearest-rank p50 and p99 of the recent waits.
func (c *counters) percentiles() (p50, p99 time.Duration) {
	n := min(c.recorded, statsWindow)
	if n == 0 {
		return 0, 0
	}
	s := slices.Clone(c.recent[:n])
	slices.Sort(s)
	rank := func(p int) time.Duration { return s[(p*n+99)/100-1] }
	return rank(50), rank(99)
}

// Stats is a snapshot of the gate's figures.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := Stats{
		Waits:      g.stats.waits,
		Failed:     g.stats.failed,
		Ships:      g.stats.ships,
		ShipErrors: g.stats.shipErrors,
		Waiting:    g.waiting,
		Landing:    g.landing,
		LandTime:   g.landTime,
		Closed:     g.closed,
	}
	s.WaitP50, s.WaitP99 = g.stats.percentiles()
	if g.head != nil {
		s.Lag = g.now().Sub(g.head.since)
	}
	return s
}
