package derpswitch

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"tailscale.com/derp"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

type rig struct {
	t     *testing.T
	net   *fakeNet
	clock *ManualClock
	sw    *Switcher
	logs  *observer.ObservedLogs
}

func newRig(t *testing.T, mutate func(*Config)) *rig {
	t.Helper()
	return newRigOn(t, newFakeNet(), mutate)
}

func newRigOn(t *testing.T, net *fakeNet, mutate func(*Config)) *rig {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	r := &rig{t: t, net: net, clock: NewManualClock(time.Unix(1_700_000_000, 0)), logs: logs}
	cfg := Config{
		Logger:     zap.New(core),
		DERPMap:    testMap(1, 2, 3, 4),
		HomeRegion: 1,
		Prove:      ProveConfig{Count: 2, Interval: time.Millisecond, Timeout: time.Second},
		Dial:       r.net.dial,
		Clock:      r.clock,
		EchoPrefix: []byte("echo:"),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	sw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.sw = sw
	sw.Start()
	t.Cleanup(func() { sw.Close() })
	return r
}

func (r *rig) waitHome(region int) {
	r.t.Helper()
	testwait.WaitFor(r.t, 5*time.Second, "home region "+itoa(region)+" connected", func() bool {
		reg, ok := r.sw.liveHome()
		return ok && reg == region
	})
}

func itoa(i int) string { return strconv.Itoa(i) }

func (r *rig) pin(region int) {
	r.t.Helper()
	if err := r.sw.SetOverride(region); err != nil {
		r.t.Fatal(err)
	}
}

func TestPinCommitsMakeBeforeBreak(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	r.pin(2)
	r.waitHome(2)
	testwait.WaitFor(t, 5*time.Second, "pin commit counted", func() bool { return r.sw.Counters().PinMBBCommits == 1 })
	c := r.sw.Counters()
	if c.PinMBBRequests != 1 || c.DERPReconnects != 0 || c.RehomeApplied != 0 || c.Rollbacks != 0 {
		t.Fatalf("counters = %+v; want 1 request, no reconnect/rehome/rollback", c)
	}
	st := r.sw.Status()
	if st.PinPending || st.HomeRegion != 2 || st.EffectiveHome != 2 || st.Override != 2 {
		t.Fatalf("status = %+v", st)
	}
	// The old home drains (still open) and closes once the drain period passes.
	roles := map[int]string{}
	for _, sl := range st.Slots {
		roles[sl.Region] = sl.Role
	}
	if roles[2] != RoleHome || roles[1] != RoleDraining {
		t.Fatalf("slots = %+v; want 2 home, 1 draining", st.Slots)
	}
	r.clock.Advance(5 * time.Second)
	testwait.WaitFor(t, 5*time.Second, "old home closed after drain", func() bool { return len(r.sw.Status().Slots) == 1 })
	// The new home was marked preferred, the old one not.
	r.net.mu.Lock()
	for _, c := range r.net.conns {
		c.mu.Lock()
		if c.region == 2 && !c.preferred || c.region == 1 && c.preferred {
			t.Errorf("region %d preferred=%v", c.region, c.preferred)
		}
		c.mu.Unlock()
	}
	r.net.mu.Unlock()
}

func TestPinUnknownRegionRefused(t *testing.T) {
	r := newRig(t, nil)
	if err := r.sw.SetOverride(999); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("SetOverride(999) = %v; want ErrUnknownRegion", err)
	}
	if r.sw.Override() != 0 {
		t.Fatal("unknown region was recorded")
	}
}

// TestEdgeCase3PinToCurrentHome is the design's edge case 3, "Pin to the current home
// region: derp_home_region == target → no-op (advert refresh only)".
func TestEdgeCase3PinToCurrentHome(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	r.pin(1)
	r.clock.Advance(3 * time.Second)
	r.clock.Advance(3 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if c := r.sw.Counters(); c.PinMBBRequests != 0 || c.RehomeApplied != 0 || c.DERPReconnects != 0 {
		t.Fatalf("counters = %+v; want nothing", c)
	}
	if r.sw.Status().PinPending {
		t.Fatal("pin_pending for a pin to the current home")
	}
}

func TestPinRetryForeverWithBackoff(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	r.net.setDown(3, true)
	r.pin(3)
	testwait.WaitFor(t, 5*time.Second, "first rollback", func() bool { return r.sw.Counters().Rollbacks == 1 })

	for i, step := range []time.Duration{5 * time.Second, 15 * time.Second, 60 * time.Second, 60 * time.Second} {
		testwait.WaitFor(t, 5*time.Second, "retry scheduled", func() bool { return r.sw.Status().PinRetries == i+1 })
		st := r.sw.Status()
		if !st.PinPending || st.HomeRegion != 1 || !st.HomeConnected {
			t.Fatalf("attempt %d: status %+v; want pin pending with home 1 serving", i, st)
		}
		retries := r.sw.Counters().PinMBBRetries
		r.clock.Advance(step - 100*time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		if got := r.sw.Counters().PinMBBRetries; got != retries {
			t.Fatalf("attempt %d: retried %v early", i, 100*time.Millisecond)
		}
		r.clock.Advance(100 * time.Millisecond)
		testwait.WaitFor(t, 5*time.Second, "retry after "+step.String(), func() bool { return r.sw.Counters().PinMBBRetries == retries+1 })
		testwait.WaitFor(t, 5*time.Second, "rollback of retry", func() bool { return r.sw.Counters().Rollbacks == uint64(i+2) })
	}
	if c := r.sw.Counters(); c.PinMBBRequests != 1 || c.DERPReconnects != 0 || c.PinMBBCommits != 0 {
		t.Fatalf("counters = %+v", c)
	}
	// The region comes back: the next retry (60 s cadence) lands the pin.
	r.net.setDown(3, false)
	testwait.WaitFor(t, 5*time.Second, "retry scheduled", func() bool { return r.sw.Status().PinRetries == 5 })
	r.clock.Advance(60 * time.Second)
	r.waitHome(3)
	testwait.WaitFor(t, 5*time.Second, "pin commit", func() bool { return r.sw.Counters().PinMBBCommits == 1 })
	if r.sw.Status().PinPending {
		t.Fatal("pin still pending after commit")
	}
}

func TestPinBackRecoversImmediately(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	r.net.setDown(3, true)
	r.pin(3)
	testwait.WaitFor(t, 5*time.Second, "rollback", func() bool { return r.sw.Counters().Rollbacks == 1 })
	r.pin(2)
	r.waitHome(2) // no backoff wait: a new pin starts fresh
	if r.sw.Status().PinRetryIn != "" {
		t.Fatal("retry schedule survived a pin change")
	}
}

// TestEdgeCase5PinChangedMidMBB is the design's edge case 5, "Pin changed N→M mid-MBB:
// Negotiator issues M, generation bump restarts executor toward M. Retry state resets."
// (The retry reset is TestPinBackRecoversImmediately.)
func TestEdgeCase5PinChangedMidMBB(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	release := r.net.holdConnect(2)
	defer release()
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "aux to 2 opening", func() bool {
		st := r.sw.Status()
		return st.Switch.Target == 2 && st.Switch.State == StateAuxOpening
	})
	r.pin(3)
	r.waitHome(3)
	release()
	time.Sleep(20 * time.Millisecond)
	c := r.sw.Counters()
	if c.MBBCommits != 1 || c.PinMBBCommits != 1 || c.Rollbacks != 0 {
		t.Fatalf("counters = %+v; want exactly one commit", c)
	}
	for _, sl := range r.sw.Status().Slots {
		if sl.Region == 2 {
			t.Fatalf("aux to preempted region 2 still open: %+v", r.sw.Status().Slots)
		}
	}
}

func TestSamePinInFlightIsNotAborted(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	release := r.net.holdConnect(2)
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "aux opening", func() bool { return r.sw.Status().Switch.State == StateAuxOpening })
	gen := r.sw.Status().Switch.Generation
	r.pin(2) // I2': an override naming the in-flight target is the override being applied
	r.clock.Advance(3 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if g := r.sw.Status().Switch.Generation; g != gen {
		t.Fatalf("generation %d -> %d; same pin must not restart the switch", gen, g)
	}
	release()
	r.waitHome(2)
	if c := r.sw.Counters(); c.PinMBBRequests != 1 || c.MBBCommits != 1 {
		t.Fatalf("counters = %+v", c)
	}
}

// TestEdgeCase4PinClearedMidMBB is the design's edge case 4, "Pin cleared (override → 0)
// mid-MBB: ... target-source was LOCK and override cleared → negotiator neg_cancel_mbb()
// on its next pass; executor aborts on generation bump. Autoneg resumes ownership."
func TestEdgeCase4PinClearedMidMBB(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	release := r.net.holdConnect(2)
	defer release()
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "aux opening", func() bool { return r.sw.Status().Switch.State == StateAuxOpening })
	r.pin(0)
	testwait.WaitFor(t, 5*time.Second, "switch cancelled", func() bool {
		st := r.sw.Status()
		return st.Switch.State == StateIdle && len(st.Slots) == 1
	})
	release()
	time.Sleep(20 * time.Millisecond)
	if reg, ok := r.sw.liveHome(); !ok || reg != 1 {
		t.Fatalf("home = %d (alive %v); want 1", reg, ok)
	}
	if c := r.sw.Counters(); c.MBBCommits != 0 {
		t.Fatalf("commit after the pin was cleared: %+v", c)
	}
}

// TestNoLiveHomePinCommitsOnlyWhenProven: with no live home (the boot home never came
// up) a pin still goes through the prove step: the home moves to the pin's region once
// that region is proven, never by a teardown to an unproven one.
func TestNoLiveHomePinCommitsOnlyWhenProven(t *testing.T) {
	net := newFakeNet()
	net.setDown(1, true) // the boot home never comes up
	r := newRigOn(t, net, nil)
	r.pin(2)
	r.waitHome(2)
	c := r.sw.Counters()
	if c.RehomeApplied != 0 || c.PinMBBRequests != 1 || c.PinMBBCommits != 1 {
		t.Fatalf("counters = %+v; want one proven MBB commit, no teardown rehome", c)
	}
}

// TestEdgeCase8RebootWithPin is the design's edge case 8, "Reboot with pin set (NVS):
// Boot path connects directly to override region (... no live home to protect;
// unchanged)".
func TestEdgeCase8RebootWithPin(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Override = 3 })
	r.waitHome(3)
	if r.net.connectsTo(1) != 0 {
		t.Fatal("boot connected to the default home before the pin")
	}
	if c := r.sw.Counters(); c.RehomeApplied != 0 || c.PinMBBRequests != 0 {
		t.Fatalf("counters = %+v", c)
	}
}

func TestLegacyModeTearsDown(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Mode = ModeLegacy })
	r.waitHome(1)
	r.pin(2)
	r.waitHome(2)
	c := r.sw.Counters()
	if c.DERPReconnects != 1 || c.RehomeApplied != 1 || c.MBBCommits != 0 {
		t.Fatalf("counters = %+v; want one teardown reconnect", c)
	}
	if n := len(r.sw.Status().Slots); n != 1 {
		t.Fatalf("%d slots; legacy keeps no old home", n)
	}
}

func TestEchoAnsweredThroughHome(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	peer := key.NewNode().Public()
	conn := func(region int) *fakeConn {
		r.net.mu.Lock()
		defer r.net.mu.Unlock()
		for _, c := range r.net.conns {
			if c.region == region {
				return c
			}
		}
		return nil
	}
	sent := func(c *fakeConn) []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []string
		for _, p := range c.sent {
			if p.dst != peer {
				t.Errorf("reply to %v; want the sender", p.dst)
			}
			out = append(out, string(p.data))
		}
		return out
	}
	old := conn(1)
	old.inbox <- derp.ReceivedPacket{Source: peer, Data: []byte("other")}
	old.inbox <- derp.ReceivedPacket{Source: peer, Data: []byte("echo:1")}
	testwait.WaitFor(t, 5*time.Second, "echo reply", func() bool { return r.sw.Counters().EchoReplies == 1 })
	r.pin(2)
	r.waitHome(2)
	// A request arriving on the draining old home is answered through the new home.
	old.inbox <- derp.ReceivedPacket{Source: peer, Data: []byte("echo:2")}
	testwait.WaitFor(t, 5*time.Second, "echo reply via new home", func() bool { return r.sw.Counters().EchoReplies == 2 })
	if got := sent(old); len(got) != 1 || got[0] != "lchat-echo-reply:1" {
		t.Errorf("old home sent %q", got)
	}
	if got := sent(conn(2)); len(got) != 1 || got[0] != "lchat-echo-reply:2" {
		t.Errorf("new home sent %q", got)
	}
}

type fakeLatency struct {
	mu  sync.Mutex
	lat map[int]time.Duration
}

func (f *fakeLatency) set(m map[int]time.Duration) {
	f.mu.Lock()
	f.lat = m
	f.mu.Unlock()
}

func (f *fakeLatency) measure(context.Context, *tailcfg.DERPMap) map[int]time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lat
}

func TestAutonegBansRegionOnRollbackPinIgnoresBan(t *testing.T) {
	lat := &fakeLatency{}
	lat.set(map[int]time.Duration{1: 90 * time.Millisecond, 2: 30 * time.Millisecond, 3: 80 * time.Millisecond})
	r := newRig(t, func(c *Config) {
		c.Autoneg = AutonegConfig{Enabled: true, Interval: time.Second, StabilityWindow: 10 * time.Second, Dwell: time.Minute, MaxSwitchesPerHour: 2, BanDuration: time.Hour}
		c.Latency = lat.measure
	})
	r.waitHome(1)
	r.net.setDown(2, true)
	for i := 0; i < 6; i++ { // 18 s: past the stability window
		r.clock.Advance(3 * time.Second)
		time.Sleep(5 * time.Millisecond)
	}
	testwait.WaitFor(t, 5*time.Second, "autoneg rollback", func() bool { return r.sw.Counters().Rollbacks == 1 })
	r.net.setDown(2, false)
	for i := 0; i < 10; i++ {
		r.clock.Advance(3 * time.Second)
		time.Sleep(5 * time.Millisecond)
	}
	if reg, _ := r.sw.liveHome(); reg != 1 {
		t.Fatalf("moved to banned region: home %d", reg)
	}
	// A pin ignores the ban.
	r.pin(2)
	r.waitHome(2)
}

func TestReconfigureRemovesRegionOfInFlightSwitch(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	release := r.net.holdConnect(2)
	defer release()
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "aux opening", func() bool { return r.sw.Status().Switch.State == StateAuxOpening })
	cfg := r.sw.config()
	cfg.DERPMap = testMap(1, 3, 4)
	if err := r.sw.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	testwait.WaitFor(t, 5*time.Second, "switch aborted and pin cleared", func() bool {
		st := r.sw.Status()
		return st.Switch.State == StateIdle && st.Override == 0 && len(st.Slots) == 1
	})
	if err := r.sw.SetOverride(2); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("pin to removed region: %v", err)
	}
	// The executor is still responsive: a new pin lands.
	r.pin(3)
	r.waitHome(3)
}

// countingClock counts the negotiator's (and executor's) waits, to catch a loop that
// re-arms an already expired deadline instead of blocking.
type countingClock struct {
	*ManualClock
	afters atomic.Int64
}

func (c *countingClock) After(d time.Duration) <-chan time.Time {
	c.afters.Add(1)
	return c.ManualClock.After(d)
}

// idleWaits returns how many waits were armed during a short real-time window in which
// nothing happens; a blocked loop arms none, a spinning one thousands.
func idleWaits(c *countingClock) int64 {
	n := c.afters.Load()
	time.Sleep(50 * time.Millisecond)
	return c.afters.Load() - n
}

func TestNegotiatorBlocksWhileRetryInFlight(t *testing.T) {
	cc := &countingClock{ManualClock: NewManualClock(time.Unix(1_700_000_000, 0))}
	r := newRig(t, func(c *Config) { c.Clock = cc })
	r.clock = cc.ManualClock
	r.waitHome(1)
	r.net.setDown(3, true)
	r.pin(3)
	testwait.WaitFor(t, 5*time.Second, "rollback", func() bool { return r.sw.Counters().Rollbacks == 1 })
	release := r.net.holdConnect(3) // the retry's connect hangs, as against a blackholed region
	defer release()
	testwait.WaitFor(t, 5*time.Second, "retry scheduled", func() bool { return r.sw.Status().PinRetries == 1 })
	r.clock.Advance(5 * time.Second)
	testwait.WaitFor(t, 5*time.Second, "retry in flight", func() bool {
		return r.sw.Counters().PinMBBRetries == 1 && r.sw.Status().Switch.State == StateAuxOpening
	})
	if n := idleWaits(cc); n > 2 {
		t.Fatalf("negotiator armed %d waits in 50ms with a retry in flight; want it blocked", n)
	}
}

func TestRetryScheduleDroppedWhenReconcileRehomesToPin(t *testing.T) {
	cc := &countingClock{ManualClock: NewManualClock(time.Unix(1_700_000_000, 0))}
	r := newRig(t, func(c *Config) { c.Clock = cc })
	r.clock = cc.ManualClock
	r.waitHome(1)
	r.net.setDown(3, true)
	r.pin(3)
	testwait.WaitFor(t, 5*time.Second, "retry scheduled", func() bool { return r.sw.Status().PinRetries == 1 })
	// The home's region leaves the DERP map: reconcile rehomes straight to the pin.
	cfg := r.sw.config()
	cfg.DERPMap, cfg.HomeRegion = testMap(2, 3, 4), 2
	if err := r.sw.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	testwait.WaitFor(t, 5*time.Second, "home slot on the pin", func() bool {
		h := r.sw.homePtr.Load()
		return h != nil && h.region == 3
	})
	testwait.WaitFor(t, 5*time.Second, "retry schedule dropped", func() bool { return r.sw.Status().PinRetryIn == "" })
	r.clock.Advance(5 * time.Second) // past the old retry deadline
	if n := idleWaits(cc); n > 2 {
		t.Fatalf("negotiator armed %d waits in 50ms after the pin's region became the home slot", n)
	}
	r.net.setDown(3, false)
	r.waitHome(3)
	if c := r.sw.Counters(); c.PinMBBRetries != 0 {
		t.Fatalf("counters = %+v; a retry was issued for a pin the home slot already serves", c)
	}
}

// advanceUntil drives the clock in steps until cond holds (each step gives the
// goroutines a moment to act on the ticks it fired).
func (r *rig) advanceUntil(step time.Duration, maxSteps int, what string, cond func() bool) {
	r.t.Helper()
	for i := 0; i <= maxSteps; i++ {
		deadline := time.Now().Add(100 * time.Millisecond)
		for time.Now().Before(deadline) {
			if cond() {
				return
			}
			time.Sleep(time.Millisecond)
		}
		if i < maxSteps {
			r.clock.Advance(step)
		}
	}
	r.t.Fatalf("%s: not reached after %d steps of %v", what, maxSteps, step)
}

func TestAutonegMovesHomeAndResumesAfterPinCleared(t *testing.T) {
	ms := time.Millisecond
	lat := &fakeLatency{}
	lat.set(map[int]time.Duration{1: 90 * ms, 2: 30 * ms, 3: 80 * ms, 4: 85 * ms})
	type commit struct {
		region int
		at     time.Time
	}
	commits := make(chan commit, 16)
	var clock *ManualClock
	r := newRig(t, func(c *Config) {
		clock = c.Clock.(*ManualClock)
		c.Autoneg = AutonegConfig{Enabled: true, Interval: time.Second, StabilityWindow: 10 * time.Second,
			Dwell: time.Minute, MaxSwitchesPerHour: 4, BanDuration: time.Hour}
		c.Latency = lat.measure
		c.OnCommit = func(region int) { commits <- commit{region, clock.Now()} }
	})
	t0 := r.clock.Now()
	r.waitHome(1)

	// Region 2 is clearly better: autonegotiation moves the home there make-before-break,
	// but only once the stability window has passed.
	r.advanceUntil(3*time.Second, 10, "autoneg commit to 2", func() bool {
		reg, ok := r.sw.liveHome()
		return ok && reg == 2
	})
	c := <-commits
	if c.region != 2 || c.at.Sub(t0) < 10*time.Second {
		t.Fatalf("autoneg commit to %d at +%v; want region 2 after the 10s stability window", c.region, c.at.Sub(t0))
	}
	st := r.sw.Status()
	if st.Switch.Source != "autoneg" || st.MBBCommits != 1 || st.PinMBBRequests != 0 || st.PinMBBCommits != 0 || st.DERPReconnects != 0 {
		t.Fatalf("after autoneg switch: %+v", st)
	}

	// A pin moves the home at once, inside the dwell time autonegotiation would respect.
	r.pin(3)
	r.waitHome(3)
	if c := <-commits; c.region != 3 {
		t.Fatalf("pin commit to %d; want 3", c.region)
	}
	// While pinned, autonegotiation never moves the home, however long region 2 stays better.
	pinnedAt := r.clock.Now()
	for r.clock.Now().Sub(pinnedAt) < 3*time.Minute {
		r.clock.Advance(3 * time.Second)
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if reg, _ := r.sw.liveHome(); reg != 3 || len(commits) != 0 {
		t.Fatalf("home %d, %d extra commits while pinned; want the pin to hold", reg, len(commits))
	}

	// Clearing the pin hands the home back to autonegotiation: after a fresh stability
	// window it returns to region 2.
	r.pin(0)
	clearedAt := r.clock.Now()
	r.advanceUntil(3*time.Second, 10, "autoneg resumes", func() bool {
		reg, ok := r.sw.liveHome()
		return ok && reg == 2
	})
	if c := <-commits; c.region != 2 || c.at.Sub(clearedAt) < 10*time.Second {
		t.Fatalf("commit to %d at +%v after clearing; want region 2 after the stability window", c.region, c.at.Sub(clearedAt))
	}
	if st := r.sw.Status(); st.Switch.Source != "autoneg" || st.PinMBBCommits != 1 || st.Rollbacks != 0 {
		t.Fatalf("after resume: %+v", st)
	}
}

func TestReconfigureSwitchesLogger(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	core, logs := observer.New(zap.InfoLevel)
	cfg := r.sw.config()
	cfg.Logger = zap.New(core)
	if err := r.sw.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	r.pin(2)
	r.waitHome(2)
	testwait.WaitFor(t, 5*time.Second, "commit logged", func() bool { return logs.FilterMessageSnippet("MBB COMMIT").Len() == 1 })
	if logs.FilterMessageSnippet("PIN via MBB").Len() != 1 {
		t.Fatalf("a reload's logger did not receive the switch log lines: %v", logs.All())
	}
}
