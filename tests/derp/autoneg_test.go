package derp

import (
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/derpswitch"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestAutonegByDERPLatency: autonegotiation measures DERP ping/pong, not TCP connect
// time. Every region's proxy accepts TCP at once; the DERP protocol is slowed by a
// per-chunk delay (home 1: 60 ms each way, region 2: 45 ms, region 3: 70 ms). Region 2
// is faster than the home but not by a third (Tailscale's hysteresis), so the home
// stays. Then region 3 becomes fast for DERP while slow to open (its handshake waits
// 300 ms): the home moves there, make-before-break, once the stability window passed.
func TestAutonegByDERPLatency(t *testing.T) {
	regions, m := startRegions(t, 3)
	regions[0].proxy.SetLatency(60 * time.Millisecond)
	regions[1].proxy.SetLatency(45 * time.Millisecond)
	regions[2].proxy.SetLatency(70 * time.Millisecond)
	b := startBox(t, m, func(c *derpswitch.Config) {
		c.Autoneg = derpswitch.AutonegConfig{Enabled: true, Interval: 300 * time.Millisecond,
			StabilityWindow: 1500 * time.Millisecond, Dwell: time.Second, MaxSwitchesPerHour: 4, BanDuration: time.Minute}
		c.TickInterval = 200 * time.Millisecond
	})
	b.waitHome(t, 1, 10*time.Second)
	harness.WaitFor(t, 15*time.Second, "every region measured", func() bool { return len(b.sw.Status().Latencies) == 3 })
	time.Sleep(3 * time.Second) // two stability windows
	st := b.sw.Status()
	if st.HomeRegion != 1 || st.MBBCommits != 0 {
		t.Fatalf("moved to a region not a third faster: %+v", st)
	}
	if st.Autoneg != "no clearly better region" {
		t.Fatalf("autoneg %q; want the hysteresis to hold", st.Autoneg)
	}
	t.Logf("latencies with region 2 only slightly faster: %v", st.Latencies)

	regions[2].proxy.SetLatency(0)
	regions[2].proxy.SetDelay(300 * time.Millisecond)
	b.waitHome(t, 3, 20*time.Second)
	st = b.sw.Status()
	if st.Switch.Source != "autoneg" || st.MBBCommits != 1 || st.DERPReconnects != 0 || st.RehomeApplied != 0 {
		t.Fatalf("after the switch: %+v", st)
	}
	lat1, _ := time.ParseDuration(st.Latencies[1])
	lat3, _ := time.ParseDuration(st.Latencies[3])
	if lat1 < 100*time.Millisecond || lat3 > 50*time.Millisecond {
		t.Fatalf("latencies %v; want DERP round trips (1 ≈ 120 ms, 3 fast despite its slow open)", st.Latencies)
	}
	t.Logf("latencies after region 3 became fast: %v", st.Latencies)
}
