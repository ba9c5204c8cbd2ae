package derp

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/derpswitch"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestBenchHomeBlipRecovery prints how long the home takes to come back after a blip
// (its connections dropped and its region refusing new ones for 50 ms) while a pin
// toward an unreachable region is pending: from the drop until the home is connected
// again on the same region, and the echo gap each blip causes. Run with
// LCHAT_DERP_BENCH=1 (a measurement, not a check).
func TestBenchHomeBlipRecovery(t *testing.T) {
	if os.Getenv("LCHAT_DERP_BENCH") == "" {
		t.Skip("set LCHAT_DERP_BENCH=1 to run the benchmark harness")
	}
	const n = 20
	const blip = 50 * time.Millisecond
	regions, m := startRegions(t, 3)
	b := startBox(t, m, func(c *derpswitch.Config) { c.RetryBackoff = []time.Duration{time.Second} })
	b.waitHome(t, 1, 10*time.Second)
	peer := startEchoPeer(t, m, b.key.Public(), 20*time.Millisecond)
	waitEcho(t, peer)
	regions[2].proxy.SetRefuse(true, true)
	b.pin(t, 3)
	harness.WaitFor(t, 10*time.Second, "pin pending", func() bool { return b.sw.Counters().Rollbacks >= 1 })
	var rec, gaps []time.Duration
	for i := 0; i < n; i++ {
		mark := peer.mark()
		rec = append(rec, b.blipHome(t, regions[0], 1, blip))
		waitEcho(t, peer)
		gaps = append(gaps, maxGap(peer.gaps(mark)))
		time.Sleep(200 * time.Millisecond)
	}
	st := b.sw.Status()
	if !st.PinPending || st.HomeRegion != 1 || st.RehomeApplied != 0 {
		t.Fatalf("status after the blips: %+v", st)
	}
	fmt.Printf("\nhome-blip recovery with a pin pending (blip: connections dropped, region refusing for %v; echo every 20 ms)\n", blip)
	fmt.Printf("%-30s %5s %10s %10s\n", "", "n", "p50", "max")
	fmt.Printf("%-30s %5d %10s %10s\n", "drop → home connected again", n,
		percentile(rec, 0.5).Round(time.Millisecond), percentile(rec, 1).Round(time.Millisecond))
	fmt.Printf("%-30s %5d %10s %10s\n", "echo gap", n,
		percentile(gaps, 0.5).Round(time.Millisecond), percentile(gaps, 1).Round(time.Millisecond))
	fmt.Printf("home moved: %v; rehome_applied %d; derp_reconnects %d; pin retries meanwhile %d\n",
		st.HomeRegion != 1, st.RehomeApplied, st.DERPReconnects, st.PinMBBRetries)
}
