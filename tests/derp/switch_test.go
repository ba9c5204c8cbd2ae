package derp

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"

	"github.com/lchat/lchat-caddy/derpswitch"
	"github.com/lchat/lchat-caddy/tests/harness"
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
	harness.WaitFor(t, timeout, fmt.Sprintf("home region %d connected", region), func() bool {
		st := b.sw.Status()
		return st.HomeRegion == region && st.HomeConnected
	})
}

// drained reports whether st holds no draining slot: every old home's drain has ended
// and its connection is closed.
func drained(st derpswitch.Status) bool {
	for _, sl := range st.Slots {
		if sl.Role == derpswitch.RoleDraining {
			return false
		}
	}
	return true
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
	harness.WaitFor(t, 5*time.Second, "echo replies", func() bool { return e.count() >= n+3 })
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
	harness.WaitFor(t, 5*time.Second, "aux to 2 proving", func() bool {
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
			harness.WaitFor(t, 15*time.Second, "commit", func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return len(b.commits) > nc
			})
			b.mu.Lock()
			out = append(out, b.commits[nc].at.Sub(at))
			b.mu.Unlock()
			cur = target
			// Past the drain, so every switch opens a fresh connection.
			harness.WaitFor(t, 5*time.Second, "the old home drained", func() bool { return drained(b.sw.Status()) })
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
