package derpswitch

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"tailscale.com/derp"
	"tailscale.com/types/key"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// The design's edge cases (gapless-forced-region-switch.md §6) not covered by a test of
// the same name in switcher_test.go, the home-blip cases of issue 13, and the prove step.

// homeLostLog and teardownLog are the design's triage lines: a flush of the home logs
// "DERP reconnect requested" (the in-place reconnect); a teardown rehome logs it with
// "(teardown rehome)".
const (
	homeLostLog = "DERP reconnect requested (home connection lost; reconnecting in place)"
	teardownLog = "DERP reconnect requested (teardown rehome)"
)

// blipHome drops every connection to the home region (a flush) for d of real time and
// checks that the home is reconnected in place: the same region, no teardown rehome.
func (r *rig) blipHome(region int, d time.Duration) {
	r.t.Helper()
	before := r.net.connectsTo(region)
	lost := r.logs.FilterMessage(homeLostLog).Len()
	restore := r.net.blip(region)
	testwait.WaitFor(r.t, 5*time.Second, "home loss noticed", func() bool { return r.logs.FilterMessage(homeLostLog).Len() > lost })
	time.Sleep(d) // the negotiator has been poked and runs its passes while the home is down
	if h := r.sw.homePtr.Load(); h == nil || h.region != region {
		r.t.Fatalf("home slot moved off region %d while the home was down: %+v", region, r.sw.Status())
	}
	restore()
	testwait.WaitFor(r.t, 5*time.Second, "home reconnected in place", func() bool {
		reg, ok := r.sw.liveHome()
		return ok && reg == region && r.net.connectsTo(region) > before
	})
	if c := r.sw.Counters(); c.RehomeApplied != 0 || r.logs.FilterMessage(teardownLog).Len() != 0 {
		r.t.Fatalf("a home blip caused a teardown rehome: %+v", c)
	}
}

// TestHomeBlipDuringEveryPhase drops the home for 150 ms in each phase of a pinned
// switch. Every time the home is reconnected in place, the switch carries on from where
// it was, and the only home move is the commit to the proven pin.
func TestHomeBlipDuringEveryPhase(t *testing.T) {
	t.Run("pending retry", func(t *testing.T) {
		r := newRig(t, nil)
		r.waitHome(1)
		r.net.setDown(3, true)
		r.pin(3)
		testwait.WaitFor(t, 5*time.Second, "retry scheduled", func() bool { return r.sw.Status().PinRetries == 1 })
		r.blipHome(1, 150*time.Millisecond)
		st := r.sw.Status()
		if !st.PinPending || st.PinRetries != 1 || st.Rollbacks != 1 {
			t.Fatalf("after blip: %+v; want the pin still pending on its retry schedule", st)
		}
		r.net.setDown(3, false)
		r.clock.Advance(5 * time.Second)
		r.waitHome(3)
	})
	t.Run("aux opening", func(t *testing.T) {
		r := newRig(t, nil)
		r.waitHome(1)
		release := r.net.holdConnect(3)
		defer release()
		r.pin(3)
		testwait.WaitFor(t, 5*time.Second, "aux opening", func() bool { return r.sw.Status().Switch.State == StateAuxOpening })
		gen := r.sw.Status().Switch.Generation
		r.blipHome(1, 150*time.Millisecond)
		if st := r.sw.Status(); st.Switch.Generation != gen || st.Switch.State != StateAuxOpening {
			t.Fatalf("after blip: %+v; want the same switch still opening", st.Switch)
		}
		release()
		r.waitHome(3)
	})
	t.Run("proving", func(t *testing.T) {
		r := newRig(t, nil)
		r.waitHome(1)
		release := r.net.holdPings(3)
		defer release()
		r.pin(3)
		testwait.WaitFor(t, 5*time.Second, "proving", func() bool { return r.sw.Status().Switch.State == StateProving })
		gen := r.sw.Status().Switch.Generation
		r.blipHome(1, 150*time.Millisecond)
		if st := r.sw.Status(); st.Switch.Generation != gen || st.Switch.State != StateProving {
			t.Fatalf("after blip: %+v; want the same switch still proving", st.Switch)
		}
		release()
		r.waitHome(3)
	})
	t.Run("draining", func(t *testing.T) {
		r := newRig(t, nil)
		r.waitHome(1)
		r.pin(3)
		r.waitHome(3)
		// The new home blips while the old one drains: it is reconnected in place,
		// never swapped back to the draining connection.
		r.blipHome(3, 150*time.Millisecond)
		r.clock.Advance(5 * time.Second)
		testwait.WaitFor(t, 5*time.Second, "old home drained", func() bool { return len(r.sw.Status().Slots) == 1 })
	})
	t.Run("idle, no pin", func(t *testing.T) {
		r := newRig(t, nil)
		r.waitHome(1)
		r.blipHome(1, 150*time.Millisecond)
	})
}

// TestEdgeCase6HomeDiesMidMBB is the design's edge case 6, "Home conn dies mid-MBB
// (flush during switch): Executor's existing stability gates fail → rollback; RST path
// reconnects home as today (out of scope); negotiator retries pin once home is back".
// Here the home is reconnected in place (issue 13) and the prove of the target does not
// depend on the home, so the switch is not rolled back: it commits once the target is
// proven, and only then.
func TestEdgeCase6HomeDiesMidMBB(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	release := r.net.holdPings(2)
	defer release()
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "proving", func() bool { return r.sw.Status().Switch.State == StateProving })
	restore := r.net.blip(1) // the home dies and stays down
	testwait.WaitFor(t, 5*time.Second, "home loss noticed", func() bool { return r.logs.FilterMessage(homeLostLog).Len() == 1 })
	r.clock.Advance(3 * time.Second) // negotiator passes while the home is dead
	time.Sleep(50 * time.Millisecond)
	if h := r.sw.homePtr.Load(); h.region != 1 {
		t.Fatalf("home moved to %d before the target was proven", h.region)
	}
	release()
	r.waitHome(2)
	restore()
	c := r.sw.Counters()
	if c.RehomeApplied != 0 || c.PinMBBCommits != 1 || c.Rollbacks != 0 {
		t.Fatalf("counters = %+v; want one proven commit, no teardown", c)
	}
	if r.logs.FilterMessage(teardownLog).Len() != 0 {
		t.Fatal("teardown rehome logged")
	}
	commit := r.logs.FilterMessage("MBB COMMIT (no teardown)").All()
	if len(commit) != 1 || commit[0].ContextMap()["old_home_connected"] != false {
		t.Fatalf("commit log %v; want one commit over the dead home", commit)
	}
}

// TestEdgeCase7PinnedRegionGenuinelyDead is the design's edge case 7, "Pinned region
// genuinely dead: Retry-forever with 60 s cap; pin_pending visible; old home serves
// indefinitely. Operator sees unfulfilled pin in status rather than a disarm." The home
// blips between retries, as in issue 13's reproduction: each time it is reconnected in
// place and never moved onto the dead region.
func TestEdgeCase7PinnedRegionGenuinelyDead(t *testing.T) {
	r := newRig(t, nil)
	r.waitHome(1)
	r.net.setDown(3, true)
	r.pin(3)
	for i, step := range []time.Duration{5 * time.Second, 15 * time.Second, 60 * time.Second, 60 * time.Second, 60 * time.Second} {
		testwait.WaitFor(t, 5*time.Second, "retry scheduled", func() bool { return r.sw.Status().PinRetries == i+1 })
		st := r.sw.Status()
		if !st.PinPending || st.HomeRegion != 1 || !st.HomeConnected {
			t.Fatalf("attempt %d: %+v; want the pin pending and the old home serving", i, st)
		}
		if in, _ := time.ParseDuration(st.PinRetryIn); in > 60*time.Second {
			t.Fatalf("retry in %v; want the 60s cap", in)
		}
		r.blipHome(1, 50*time.Millisecond)
		rb := r.sw.Counters().Rollbacks
		r.clock.Advance(step)
		testwait.WaitFor(t, 5*time.Second, "retry rolled back", func() bool { return r.sw.Counters().Rollbacks == rb+1 })
	}
	if c := r.sw.Counters(); c.PinMBBRetries != 5 || c.RehomeApplied != 0 || c.PinMBBCommits != 0 {
		t.Fatalf("counters = %+v", c)
	}
}

// autonegRig is a rig with autonegotiation on, region 2 clearly the fastest.
func autonegRig(t *testing.T) *rig {
	lat := &fakeLatency{}
	ms := time.Millisecond
	lat.set(map[int]time.Duration{1: 90 * ms, 2: 30 * ms, 3: 80 * ms, 4: 85 * ms})
	return newRig(t, func(c *Config) {
		c.Autoneg = AutonegConfig{Enabled: true, Interval: time.Second, StabilityWindow: 10 * time.Second,
			Dwell: time.Minute, MaxSwitchesPerHour: 4, BanDuration: time.Hour}
		c.Latency = lat.measure
	})
}

// TestEdgeCase1PinWhileAutonegToOtherRegion is the design's edge case 1, "Pin while
// autoneg MBB in flight toward a different region: Negotiator issues pin target →
// generation bump preempts (executor restarts toward pin). I2' aborts nothing
// (override == new target)."
func TestEdgeCase1PinWhileAutonegToOtherRegion(t *testing.T) {
	r := autonegRig(t)
	r.waitHome(1)
	release := r.net.holdConnect(2)
	defer release()
	r.advanceUntil(3*time.Second, 10, "autoneg switch to 2 in flight", func() bool {
		st := r.sw.Status()
		return st.Switch.Source == "autoneg" && st.Switch.Target == 2 && st.Switch.State == StateAuxOpening
	})
	gen := r.sw.Status().Switch.Generation
	r.pin(3)
	r.waitHome(3)
	release()
	time.Sleep(20 * time.Millisecond)
	st := r.sw.Status()
	if st.Switch.Generation != gen+1 || st.Switch.Source != "pin" {
		t.Fatalf("switch %+v; want the pin one generation after the autoneg switch", st.Switch)
	}
	if st.MBBCommits != 1 || st.PinMBBCommits != 1 || st.Rollbacks != 0 {
		t.Fatalf("counters %+v; want exactly one commit, the pin's", st.Counters)
	}
	// The executor may see the override (I2', naming another region) before the new
	// generation; either way the autoneg switch is aborted exactly once.
	if n := r.logs.FilterMessage("MBB aborted").FilterField(zap.Int("target_region", 2)).Len(); n != 1 {
		t.Fatalf("%d aborts of the switch to 2 logged; want 1", n)
	}
}

// TestEdgeCase2PinWhileAutonegToSameRegion is the design's edge case 2, "Pin while
// autoneg MBB in flight toward the same region: Dedupe: command already in flight;
// executor proceeds; commit satisfies the pin."
func TestEdgeCase2PinWhileAutonegToSameRegion(t *testing.T) {
	r := autonegRig(t)
	r.waitHome(1)
	release := r.net.holdConnect(2)
	defer release()
	r.advanceUntil(3*time.Second, 10, "autoneg switch to 2 in flight", func() bool {
		st := r.sw.Status()
		return st.Switch.Source == "autoneg" && st.Switch.Target == 2 && st.Switch.State == StateAuxOpening
	})
	gen := r.sw.Status().Switch.Generation
	r.pin(2)
	r.clock.Advance(3 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if g := r.sw.Status().Switch.Generation; g != gen {
		t.Fatalf("generation %d -> %d; the pin must join the switch in flight", gen, g)
	}
	release()
	r.waitHome(2)
	testwait.WaitFor(t, 5*time.Second, "pin satisfied", func() bool { return !r.sw.Status().PinPending })
	if c := r.sw.Counters(); c.MBBCommits != 1 || c.PinMBBCommits != 1 || c.PinMBBRequests != 0 {
		t.Fatalf("counters %+v; want the one in-flight commit to satisfy the pin", c)
	}
}

// TestEdgeCase9StalePeerNetmaps is the design's edge case 9, "Remote peers' stale
// netmap: Unchanged: microlink_request_announce re-advertise still fires ... MBB commit
// additionally sends NOTE_PREFERRED on both conns." The re-advertise is the OnCommit
// hook; a peer still sending to the old home is answered through the new one.
func TestEdgeCase9StalePeerNetmaps(t *testing.T) {
	adverts := make(chan int, 4)
	r := newRig(t, func(c *Config) { c.OnCommit = func(region int) { adverts <- region } })
	r.waitHome(1)
	old := r.net.conn(1)
	r.pin(2)
	r.waitHome(2)
	if got := <-adverts; got != 2 {
		t.Fatalf("re-advertised region %d; want 2", got)
	}
	newHome := r.net.conn(2)
	old.mu.Lock()
	oldPref := old.preferred
	old.mu.Unlock()
	newHome.mu.Lock()
	newPref := newHome.preferred
	newHome.mu.Unlock()
	if oldPref || !newPref {
		t.Fatalf("preferred: old %v, new %v; want false, true", oldPref, newPref)
	}
	peer := key.NewNode().Public()
	old.inbox <- derp.ReceivedPacket{Source: peer, Data: []byte("echo:stale")}
	testwait.WaitFor(t, 5*time.Second, "stale peer answered", func() bool {
		newHome.mu.Lock()
		defer newHome.mu.Unlock()
		return len(newHome.sent) == 1 && string(newHome.sent[0].data) == "lchat-echo-reply:stale"
	})
}

// TestNoCommitAfterPinCleared: the prove of a pin's switch finishes at the moment the
// pin is cleared (inside its last pong), before the negotiator's next pass could cancel
// it. The switch must not commit: a cleared pin moves nothing.
func TestNoCommitAfterPinCleared(t *testing.T) {
	for i := 0; i < 10; i++ {
		net := newFakeNet()
		var r *rig
		pongs := 0
		net.pongHook = func(region int) {
			if pongs++; region == 2 && pongs == 2 { // the last of the 2 prove pings
				r.sw.SetOverride(0)
			}
		}
		r = newRigOn(t, net, nil)
		r.waitHome(1)
		r.pin(2)
		testwait.WaitFor(t, 5*time.Second, "switch over", func() bool {
			st := r.sw.Status()
			return st.Override == 0 && st.Switch.Generation > 0 && st.Switch.State == StateIdle &&
				(len(st.Slots) == 1 || st.MBBCommits > 0)
		})
		if c := r.sw.Counters(); c.MBBCommits != 0 || r.sw.Override() != 0 {
			t.Fatalf("run %d: the cleared pin's switch committed: %+v", i, c)
		}
		if reg, _ := r.sw.liveHome(); reg != 1 {
			t.Fatalf("run %d: home %d; want 1", i, reg)
		}
		r.sw.Close()
	}
}

// TestProveAcceptsEchoAndReceivedTraffic: a region that relays packets but does not
// answer pings is proven by what it delivers (the design's "rx echo / PONG"): one
// round by an echo request, one by other traffic.
func TestProveAcceptsEchoAndReceivedTraffic(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Prove.Timeout = 5 * time.Second })
	r.waitHome(1)
	r.net.setNoPong(2, true)
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "proving", func() bool { return r.sw.Status().Switch.State == StateProving })
	aux := r.net.conn(2)
	peer := key.NewNode().Public()
	aux.inbox <- derp.ReceivedPacket{Source: peer, Data: []byte("echo:1")}
	time.Sleep(100 * time.Millisecond)
	aux.inbox <- derp.ReceivedPacket{Source: peer, Data: []byte("wireguard")}
	r.waitHome(2)
	commit := r.logs.FilterMessage("MBB COMMIT (no teardown)").All()
	if len(commit) != 1 {
		t.Fatalf("commits logged: %v", commit)
	}
	f := commit[0].ContextMap()
	if f["proof_echoes"] != int64(1) || f["proof_rx"] != int64(1) || f["proof_pongs"] != int64(0) {
		t.Fatalf("proof fields %v; want one echo and one other packet", f)
	}
}

// TestProveFailsWithoutPongOrTraffic: no pong and nothing received is a rollback.
func TestProveFailsWithoutPongOrTraffic(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Prove.Timeout = 50 * time.Millisecond })
	r.waitHome(1)
	r.net.setNoPong(2, true)
	r.pin(2)
	testwait.WaitFor(t, 5*time.Second, "rollback", func() bool { return r.sw.Counters().Rollbacks == 1 })
	if reg, ok := r.sw.liveHome(); reg != 1 || !ok {
		t.Fatalf("home %d (up %v); want 1", reg, ok)
	}
}

// TestDERPLatencyIsPingNotConnect: the default latency source times DERP ping/pong, on
// the home connection for the home region and on a probe connection for the others,
// and not the connect: a region slow to connect but quick to answer measures fast, a
// region quick to connect but slow to answer measures slow.
func TestDERPLatencyIsPingNotConnect(t *testing.T) {
	net := newFakeNet()
	net.connectDelay[3] = 200 * time.Millisecond
	net.pingDelay[2] = 40 * time.Millisecond
	net.pingDelay[1] = 20 * time.Millisecond
	r := newRigOn(t, net, nil)
	r.waitHome(1)
	homeConns := len(net.conns)
	lat := r.sw.measureDERPLatency(t.Context(), testMap(1, 2, 3))
	if lat[3] >= 10*time.Millisecond || lat[2] < 40*time.Millisecond || lat[1] < 20*time.Millisecond || lat[1] >= 40*time.Millisecond {
		t.Fatalf("latencies %v; want 3 fast (slow connect untimed), 1 ~20ms, 2 ~40ms", lat)
	}
	net.mu.Lock()
	defer net.mu.Unlock()
	for _, c := range net.conns[homeConns:] {
		if c.region == 1 {
			t.Fatal("a probe connection was opened to the home region; the home answers its pings")
		}
		if !c.closed {
			t.Fatalf("probe to region %d left open", c.region)
		}
	}
}
