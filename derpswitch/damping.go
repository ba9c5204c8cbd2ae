package derpswitch

import (
	"time"
)

// AutonegConfig configures latency-based autonegotiation of the home region and its
// damping. Pins skip all of it.
type AutonegConfig struct {
	// Enabled turns autonegotiation on. Default false: the home only moves on a pin.
	Enabled bool
	// Interval between latency measurements of every region. Default 30 s.
	Interval time.Duration
	// StabilityWindow is how long one candidate must stay clearly better before the
	// switch is issued. Default 60 s.
	StabilityWindow time.Duration
	// Dwell is the minimum time on a home region before autonegotiation moves it.
	// Default 5 min.
	Dwell time.Duration
	// MaxSwitchesPerHour opens the breaker: no autonegotiated switch while this many
	// happened in the last hour. Default 4.
	MaxSwitchesPerHour int
	// BanDuration is how long a region whose autonegotiated switch rolled back is
	// excluded. Default 10 min.
	BanDuration time.Duration
	// History is how far back a region's best latency counts (Tailscale's netcheck
	// keeps 5 min of reports). Default 5 min.
	History time.Duration
}

func (c *AutonegConfig) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = 30 * time.Second
	}
	if c.StabilityWindow <= 0 {
		c.StabilityWindow = 60 * time.Second
	}
	if c.Dwell <= 0 {
		c.Dwell = 5 * time.Minute
	}
	if c.MaxSwitchesPerHour <= 0 {
		c.MaxSwitchesPerHour = 4
	}
	if c.BanDuration <= 0 {
		c.BanDuration = 10 * time.Minute
	}
	if c.History <= 0 {
		c.History = 5 * time.Minute
	}
}

// ClearlyBetter reports whether candidate latency is worth leaving the current home
// for, with Tailscale's rule: at most 2/3 of the current latency and at least 10 ms
// better.
func ClearlyBetter(current, candidate time.Duration) bool {
	return candidate*3 <= current*2 && current-candidate >= 10*time.Millisecond
}

// Damper decides autonegotiated switches. It is owned by the negotiator goroutine
// (not safe for concurrent use).
type Damper struct {
	cfg AutonegConfig

	candidate      int
	candidateSince time.Time
	lastChange     time.Time
	switches       []time.Time
	bans           map[int]time.Time
	reports        []latencyReport
	// Reason is why the last Decide returned 0 (for status and logs).
	Reason string
}

type latencyReport struct {
	at  time.Time
	lat map[int]time.Duration
}

// NewDamper returns a Damper with cfg's defaults filled in.
func NewDamper(cfg AutonegConfig) *Damper {
	cfg.setDefaults()
	return &Damper{cfg: cfg, bans: map[int]time.Time{}}
}

// Decide returns the region to switch to, or 0 to stay. home is the live home region
// and lat the latest latency per region (missing = unreachable).
//
// The choice is Tailscale's preferred-DERP rule (net/netcheck,
// addReportHistoryAndSetPreferredDERP): every region reachable now is scored by its
// best latency over the last History, the best score is the candidate, and the home
// is kept unless the candidate beats the home's current latency by at least 10 ms and
// by a third (ClearlyBetter). Our damping comes on top: the candidate must also be
// clearly better in every report for StabilityWindow, the home must have been kept for
// Dwell, at most MaxSwitchesPerHour autonegotiated switches, and banned regions skipped.
func (d *Damper) Decide(now time.Time, home int, lat map[int]time.Duration) int {
	for r, until := range d.bans {
		if !now.Before(until) {
			delete(d.bans, r)
		}
	}
	cutoff := now.Add(-time.Hour)
	for len(d.switches) > 0 && !d.switches[0].After(cutoff) {
		d.switches = d.switches[1:]
	}
	d.reports = append(d.reports, latencyReport{now, lat})
	for len(d.reports) > 0 && now.Sub(d.reports[0].at) > d.cfg.History {
		d.reports = d.reports[1:]
	}
	bestRecent := map[int]time.Duration{}
	for _, rep := range d.reports {
		for r, l := range rep.lat {
			if b, ok := bestRecent[r]; !ok || l < b {
				bestRecent[r] = l
			}
		}
	}
	cur, ok := lat[home]
	if !ok || home == 0 {
		d.candidate, d.Reason = 0, "home latency unknown"
		return 0
	}
	best, bestLat := 0, time.Duration(0)
	for r := range lat { // reachable now
		if r == home {
			continue
		}
		if _, banned := d.bans[r]; banned {
			continue
		}
		l := bestRecent[r]
		if best == 0 || l < bestLat || (l == bestLat && r < best) {
			best, bestLat = r, l
		}
	}
	if best == 0 || !ClearlyBetter(cur, bestLat) || !ClearlyBetter(cur, lat[best]) {
		d.candidate, d.Reason = 0, "no clearly better region"
		return 0
	}
	if d.candidate != best {
		d.candidate, d.candidateSince = best, now
	}
	switch {
	case now.Sub(d.candidateSince) < d.cfg.StabilityWindow:
		d.Reason = "stability window"
		return 0
	case !d.lastChange.IsZero() && now.Sub(d.lastChange) < d.cfg.Dwell:
		d.Reason = "dwell"
		return 0
	case len(d.switches) >= d.cfg.MaxSwitchesPerHour:
		d.Reason = "switches per hour breaker open"
		return 0
	}
	d.Reason = ""
	return best
}

// NoteHomeChange records a committed home change (any source) for the dwell time,
// and an autonegotiated one for the breaker.
func (d *Damper) NoteHomeChange(now time.Time, autoneg bool) {
	d.lastChange = now
	d.candidate = 0
	if autoneg {
		d.switches = append(d.switches, now)
	}
}

// Ban excludes region from autonegotiation for the ban duration.
func (d *Damper) Ban(now time.Time, region int) {
	d.bans[region] = now.Add(d.cfg.BanDuration)
	if d.candidate == region {
		d.candidate = 0
	}
}
