package derp

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"

	"github.com/lchat/lchat-caddy/derpswitch"
)

// box is a derpswitch engine with a real derphttp dialer, as the derp_switch app runs it.
type box struct {
	sw   *derpswitch.Switcher
	key  key.NodePrivate
	logs *observer.ObservedLogs

	mu      sync.Mutex
	commits []commitEvent
}

type commitEvent struct {
	region int
	at     time.Time
}

func startBox(t testing.TB, m *tailcfg.DERPMap, mutate func(*derpswitch.Config)) *box {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	b := &box{key: key.NewNode(), logs: logs}
	cfg := derpswitch.Config{
		DERPMap:    m,
		HomeRegion: 1,
		Prove:      derpswitch.ProveConfig{Count: 3, Interval: 50 * time.Millisecond, Timeout: time.Second},
		Drain:      time.Second,
		EchoPrefix: []byte("lchat-echo:"),
		Dial:       derpswitch.DERPHTTPDialer(b.key, logger.Discard),
		Logger:     zap.New(core),
		OnCommit: func(region int) {
			b.mu.Lock()
			b.commits = append(b.commits, commitEvent{region, time.Now()})
			b.mu.Unlock()
		},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	sw, err := derpswitch.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sw.Start()
	t.Cleanup(func() { sw.Close() })
	b.sw = sw
	return b
}

func (b *box) waitHome(t testing.TB, region int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("home region %d connected", region), func() bool {
		st := b.sw.Status()
		return st.HomeRegion == region && st.HomeConnected
	})
}

func (b *box) pin(t testing.TB, region int) time.Time {
	t.Helper()
	at := time.Now()
	if err := b.sw.SetOverride(region); err != nil {
		t.Fatal(err)
	}
	return at
}

func (b *box) logCount(msg string) int {
	return b.logs.FilterMessageSnippet(msg).Len()
}

// waitEcho waits until the peer has received replies again.
func waitEcho(t testing.TB, e *echoPeer) {
	t.Helper()
	n := e.count()
	waitFor(t, 5*time.Second, "echo replies", func() bool { return e.count() >= n+3 })
}

// TestMatrix pins across four regions in a cycle: every switch commits make-before-break
// (no teardown: derp_reconnects stays flat) and the echo never gaps over 500 ms.
func TestMatrix(t *testing.T) {
	regions, m := startRegions(t, 4)
	_ = regions
	b := startBox(t, m, nil)
	b.waitHome(t, 1, 10*time.Second)
	peer := startEchoPeer(t, m, b.key.Public(), 100*time.Millisecond)
	waitEcho(t, peer)
	start := peer.mark()
	before := b.sw.Counters()

	cycle := []int{2, 3, 4, 1, 3, 2, 4, 1}
	for i, r := range cycle {
		b.pin(t, r)
		b.waitHome(t, r, 10*time.Second)
		waitFor(t, 5*time.Second, "pin commit counted", func() bool {
			return b.sw.Counters().PinMBBCommits == before.PinMBBCommits+uint64(i+1)
		})
		time.Sleep(300 * time.Millisecond) // let echo run on the new home
	}
	after := b.sw.Counters()
	if after.DERPReconnects != before.DERPReconnects || after.RehomeApplied != before.RehomeApplied {
		t.Errorf("teardown during the matrix: reconnects %d -> %d, rehome %d -> %d",
			before.DERPReconnects, after.DERPReconnects, before.RehomeApplied, after.RehomeApplied)
	}
	if after.PinMBBRequests-before.PinMBBRequests != uint64(len(cycle)) || after.Rollbacks != before.Rollbacks {
		t.Errorf("counters %+v -> %+v", before, after)
	}
	g := peer.gaps(start)
	if mg := maxGap(g); mg > 500*time.Millisecond {
		t.Errorf("echo gap %v > 500ms", mg)
	}
	for _, msg := range []string{"PIN via MBB", "MBB AUX_OPENING", "MBB COMMIT"} {
		if n := b.logCount(msg); n < len(cycle) {
			t.Errorf("log %q seen %d times; want %d", msg, n, len(cycle))
		}
	}
	if n := b.logCount("DERP reconnect requested"); n != 0 {
		t.Errorf("teardown log seen %d times", n)
	}
	t.Logf("matrix: %d switches, %d echo replies, max gap %v", len(cycle), len(g), maxGap(g))
}

// TestNegativeUnreachablePin pins a region whose server is down: the pin stays pending,
// retries at 5 s, 15 s, 60 s, 60 s on a driven clock, the old home keeps answering, and
// a pin back recovers at once.
func TestNegativeUnreachablePin(t *testing.T) {
	regions, m := startRegions(t, 4)
	clock := derpswitch.NewManualClock(time.Now())
	b := startBox(t, m, func(c *derpswitch.Config) { c.Clock = clock })
	b.waitHome(t, 1, 10*time.Second)
	peer := startEchoPeer(t, m, b.key.Public(), 100*time.Millisecond)
	waitEcho(t, peer)
	regions[3].proxy.SetRefuse(true, true) // region 4 down
	start := peer.mark()

	b.pin(t, 4)
	waitFor(t, 10*time.Second, "rollback", func() bool { return b.sw.Counters().Rollbacks == 1 })
	for i, step := range []time.Duration{5 * time.Second, 15 * time.Second, 60 * time.Second, 60 * time.Second} {
		waitFor(t, 5*time.Second, "retry scheduled", func() bool { return b.sw.Status().PinRetries == i+1 })
		st := b.sw.Status()
		if !st.PinPending || st.HomeRegion != 1 || !st.HomeConnected {
			t.Fatalf("attempt %d: status %+v", i, st)
		}
		retries := b.sw.Counters().PinMBBRetries
		clock.Advance(step - 200*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		if b.sw.Counters().PinMBBRetries != retries {
			t.Fatalf("attempt %d: retried before %v", i, step)
		}
		clock.Advance(200 * time.Millisecond)
		waitFor(t, 5*time.Second, fmt.Sprintf("retry after %v", step), func() bool {
			return b.sw.Counters().PinMBBRetries == retries+1
		})
		waitFor(t, 10*time.Second, "rollback", func() bool { return b.sw.Counters().Rollbacks == uint64(i+2) })
		waitEcho(t, peer) // the old home answers throughout
	}
	if n := b.logCount("pin MBB retry"); n != 4 {
		t.Errorf("retry log lines = %d; want 4", n)
	}
	if n := b.logCount("MBB ROLLBACK"); n != 5 {
		t.Errorf("rollback log lines = %d; want 5", n)
	}
	if mg := maxGap(peer.gaps(start)); mg > 500*time.Millisecond {
		t.Errorf("echo gap %v while the pin was pending", mg)
	}
	// Pin back to the serving home: satisfied at once, no switch, no wait for backoff.
	b.pin(t, 1)
	waitFor(t, 2*time.Second, "pin_pending cleared", func() bool {
		st := b.sw.Status()
		return !st.PinPending && st.PinRetryIn == ""
	})
	// And a pin to a reachable region commits immediately (fresh schedule).
	b.pin(t, 2)
	b.waitHome(t, 2, 10*time.Second)
	if c := b.sw.Counters(); c.DERPReconnects != 0 || c.PinMBBCommits != 1 {
		t.Errorf("counters %+v", c)
	}
}

// TestPreemption pins A, then B inside A's prove window: exactly one commit, to B.
func TestPreemption(t *testing.T) {
	regions, m := startRegions(t, 4)
	b := startBox(t, m, nil)
	b.waitHome(t, 1, 10*time.Second)
	regions[1].proxy.SetDelay(1500 * time.Millisecond) // region 2 is slow to open
	before := b.sw.Counters()
	b.pin(t, 2)
	waitFor(t, 5*time.Second, "aux to 2 opening", func() bool {
		st := b.sw.Status()
		return st.Switch.Target == 2 && st.Switch.State == derpswitch.StateAuxOpening
	})
	time.Sleep(300 * time.Millisecond)
	b.pin(t, 3)
	b.waitHome(t, 3, 10*time.Second)
	time.Sleep(2 * time.Second) // past region 2's delayed open: it must not commit late
	after := b.sw.Counters()
	if d := after.MBBCommits - before.MBBCommits; d != 1 {
		t.Fatalf("%d commits; want exactly 1", d)
	}
	b.mu.Lock()
	commits := b.commits
	b.mu.Unlock()
	if len(commits) != 1 || commits[0].region != 3 {
		t.Fatalf("commits %+v; want one to region 3", commits)
	}
	if st := b.sw.Status(); st.HomeRegion != 3 || st.PinPending {
		t.Fatalf("status %+v", st)
	}
}

// TestPreemptionWhileProving pins A and, while A's connection is up and being proven
// (ping/pong), pins B: A's switch is aborted, and the only commit is to B.
func TestPreemptionWhileProving(t *testing.T) {
	_, m := startRegions(t, 4)
	b := startBox(t, m, func(c *derpswitch.Config) {
		// A long prove (20 pings, 100 ms apart) makes the prove window easy to hit.
		c.Prove = derpswitch.ProveConfig{Count: 20, Interval: 100 * time.Millisecond, Timeout: time.Second}
	})
	b.waitHome(t, 1, 10*time.Second)
	before := b.sw.Counters()
	b.pin(t, 2)
	waitFor(t, 5*time.Second, "aux to 2 proving", func() bool {
		st := b.sw.Status()
		return st.Switch.Target == 2 && st.Switch.State == derpswitch.StateProving
	})
	b.pin(t, 3)
	b.waitHome(t, 3, 10*time.Second)
	after := b.sw.Counters()
	if d := after.MBBCommits - before.MBBCommits; d != 1 || after.PinMBBCommits-before.PinMBBCommits != 1 {
		t.Fatalf("counters %+v -> %+v; want exactly one commit", before, after)
	}
	b.mu.Lock()
	commits := slices.Clone(b.commits)
	b.mu.Unlock()
	if len(commits) != 1 || commits[0].region != 3 {
		t.Fatalf("commits %+v; want one to region 3", commits)
	}
	if n := b.logCount("MBB aborted"); n < 1 {
		t.Errorf("no abort logged for the preempted switch to 2")
	}
	for _, sl := range b.sw.Status().Slots {
		if sl.Region == 2 {
			t.Fatalf("connection to preempted region 2 still open: %+v", b.sw.Status().Slots)
		}
	}
}

type soakResult struct {
	mode      derpswitch.Mode
	switches  int
	commits   uint64
	reconn    uint64
	replies   int
	maxGap    time.Duration
	over500   int
	over1s    int
	over2s    int
	pinCommit []time.Duration
}

// runSoak pins through the regions n times with every new connection delayed by delay,
// measuring echo gaps throughout.
func runSoak(t testing.TB, mode derpswitch.Mode, n int, delay time.Duration) soakResult {
	regions, m := startRegions(t, 4)
	b := startBox(t, m, func(c *derpswitch.Config) { c.Mode = mode })
	b.waitHome(t, 1, 10*time.Second)
	peer := startEchoPeer(t, m, b.key.Public(), 100*time.Millisecond)
	waitEcho(t, peer)
	for _, r := range regions {
		r.proxy.SetDelay(delay)
	}
	start := peer.mark()
	before := b.sw.Counters()
	res := soakResult{mode: mode, switches: n}
	cur := 1
	for i := 0; i < n; i++ {
		target := cur%4 + 1
		at := b.pin(t, target)
		b.waitHome(t, target, 15*time.Second)
		res.pinCommit = append(res.pinCommit, time.Since(at))
		cur = target
		waitEcho(t, peer)
	}
	after := b.sw.Counters()
	g := peer.gaps(start)
	res.commits = after.PinMBBCommits - before.PinMBBCommits
	res.reconn = after.DERPReconnects - before.DERPReconnects
	res.replies = len(g)
	res.maxGap = maxGap(g)
	res.over500, res.over1s, res.over2s = countOver(g, 500*time.Millisecond), countOver(g, time.Second), countOver(g, 2*time.Second)
	return res
}

func soakTable(rs ...soakResult) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-7s %8s %11s %15s %8s %8s %9s %8s %8s %14s %14s\n",
		"mode", "switches", "pin_commits", "derp_reconnects", "replies", "max_gap", "gaps>0.5s", "gaps>1s", "gaps>2s", "pin→home p50", "pin→home p99")
	for _, r := range rs {
		fmt.Fprintf(&sb, "%-7s %8d %11d %15d %8d %8s %9d %8d %8d %14s %14s\n",
			r.mode, r.switches, r.commits, r.reconn, r.replies, r.maxGap.Round(time.Millisecond),
			r.over500, r.over1s, r.over2s,
			percentile(r.pinCommit, 0.5).Round(time.Millisecond), percentile(r.pinCommit, 0.99).Round(time.Millisecond))
	}
	return sb.String()
}

// TestSoak makes 25 forced switches with a 1.5 s connection delay on every region:
// make-before-break has no echo gap over 2 s and one pin commit per switch. The same
// run in legacy (teardown) mode is printed beside it.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak")
	}
	const n = 25
	const delay = 1500 * time.Millisecond
	mbb := runSoak(t, derpswitch.ModeMBB, n, delay)
	legacy := runSoak(t, derpswitch.ModeLegacy, n, delay)
	table := soakTable(mbb, legacy)
	t.Logf("soak, %d switches, %v connection delay:\n%s", n, delay, table)
	if os.Getenv("LCHAT_DERP_BENCH") != "" {
		fmt.Printf("\nsoak, %d switches, %v connection delay:\n%s", n, delay, table)
	}
	if mbb.over2s != 0 {
		t.Errorf("mbb: %d echo gaps over 2s (max %v)", mbb.over2s, mbb.maxGap)
	}
	if mbb.commits != n {
		t.Errorf("mbb: pin_mbb_commits = %d; want %d", mbb.commits, n)
	}
	if mbb.reconn != 0 {
		t.Errorf("mbb: derp_reconnects moved by %d", mbb.reconn)
	}
	if legacy.reconn != n {
		t.Errorf("legacy: derp_reconnects = %d; want one per switch (%d)", legacy.reconn, n)
	}
}

// TestBenchPinToCommit prints pin-to-commit p50/p99 on loopback with no delay and with a
// 1.5 s connection delay. Run with LCHAT_DERP_BENCH=1 (it is a measurement, not a check).
func TestBenchPinToCommit(t *testing.T) {
	if os.Getenv("LCHAT_DERP_BENCH") == "" {
		t.Skip("set LCHAT_DERP_BENCH=1 to run the benchmark harness")
	}
	measure := func(n int, delay time.Duration) []time.Duration {
		regions, m := startRegions(t, 4)
		b := startBox(t, m, nil)
		b.waitHome(t, 1, 10*time.Second)
		for _, r := range regions {
			r.proxy.SetDelay(delay)
		}
		var out []time.Duration
		cur := 1
		for i := 0; i < n; i++ {
			target := cur%4 + 1
			b.mu.Lock()
			nc := len(b.commits)
			b.mu.Unlock()
			at := b.pin(t, target)
			waitFor(t, 15*time.Second, "commit", func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return len(b.commits) > nc
			})
			b.mu.Lock()
			out = append(out, b.commits[nc].at.Sub(at))
			b.mu.Unlock()
			cur = target
			time.Sleep(1200 * time.Millisecond) // past the drain, so every switch opens a fresh connection
		}
		return out
	}
	fast := measure(40, 0)
	slow := measure(12, 1500*time.Millisecond)
	fmt.Printf("\npin-to-commit (prove: 3 pings, 50 ms apart), loopback, 4 regions\n")
	fmt.Printf("%-22s %5s %10s %10s %10s\n", "connection delay", "n", "p50", "p99", "max")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"none", fast}, {"1.5s", slow}} {
		fmt.Printf("%-22s %5d %10s %10s %10s\n", row.name, len(row.ds),
			percentile(row.ds, 0.5).Round(time.Microsecond), percentile(row.ds, 0.99).Round(time.Microsecond),
			percentile(row.ds, 1).Round(time.Microsecond))
	}
	if p50 := percentile(fast, 0.5); p50 > time.Second {
		t.Errorf("p50 pin-to-commit without delay = %v; target <= 1s", p50)
	}
}
