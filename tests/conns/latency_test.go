package conns

import (
	"context"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestLatencyFigures prints (LCHAT_CONN_BENCH=1) the figures of held connections against
// today's tunnel, through a real box: the round trip of a message to an awake space over a
// held WebSocket and over the byte tunnel, and a message to a sleeping space against a
// plain request that wakes it. It asserts nothing about time.
func TestLatencyFigures(t *testing.T) {
	if os.Getenv("LCHAT_CONN_BENCH") == "" {
		t.Skip("LCHAT_CONN_BENCH=1 prints the latency figures")
	}
	b, host := startHoldBox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dial := func(path string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+path, &websocket.DialOptions{Host: host})
		if err != nil {
			t.Fatalf("dialing %s: %v", path, err)
		}
		t.Cleanup(func() { c.CloseNow() })
		return c
	}
	roundTrip := func(c *websocket.Conn) time.Duration {
		start := time.Now()
		if err := c.Write(ctx, websocket.MessageText, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Read(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	const n = 1000
	held := dial("/ws")
	if _, _, err := held.Read(ctx); err != nil { // the welcome
		t.Fatal(err)
	}
	tunnel := dial("/tunnel")
	var heldRTT, tunnelRTT []time.Duration
	for i := range 2 * n {
		// Interleaved, so both see the same machine.
		if i%2 == 0 {
			heldRTT = append(heldRTT, roundTrip(held))
		} else {
			tunnelRTT = append(tunnelRTT, roundTrip(tunnel))
		}
	}
	hp, tp := pct(heldRTT, 50), pct(tunnelRTT, 50)
	t.Logf("awake round trip, %d messages each: held p50 %v p99 %v; tunnel p50 %v p99 %v; held/tunnel p50 %.2fx",
		n, hp, pct(heldRTT, 99), tp, pct(tunnelRTT, 99), float64(hp)/float64(tp))

	// The CPU each costs the box and the instance, in blocks (a process's CPU cannot be
	// split between interleaved messages), alternated.
	_, pid := spaceState(t, b, host)
	const rounds = 3
	var boxCPU, appCPU [2]time.Duration
	for range rounds {
		for k, c := range []*websocket.Conn{held, tunnel} {
			b0, a0 := harness.ProcessCPU(b.PID()), harness.ProcessCPU(pid)
			for range n {
				roundTrip(c)
			}
			boxCPU[k] += harness.ProcessCPU(b.PID()) - b0
			appCPU[k] += harness.ProcessCPU(pid) - a0
		}
	}
	per := func(d time.Duration) time.Duration { return d / (rounds * n) }
	t.Logf("CPU per awake round trip, %d blocks of %d alternated: the box held %v, tunnel %v (%.2fx); the instance held %v, tunnel %v",
		2*rounds, n, per(boxCPU[0]), per(boxCPU[1]), float64(boxCPU[0])/float64(boxCPU[1]), per(appCPU[0]), per(appCPU[1]))
	tunnel.Close(websocket.StatusNormalClosure, "")

	const k = 10
	var wakeReq, wakeMsg []time.Duration
	asleep := func() {
		harness.WaitFor(t, 30*time.Second, "the space asleep", func() bool {
			st, _ := spaceState(t, b, host)
			return st == "asleep"
		})
	}
	for range k {
		asleep()
		start := time.Now()
		resp, err := b.Client().Get(b.URL(host, "/healthz"))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("waking: %v %v", resp, err)
		}
		resp.Body.Close()
		wakeReq = append(wakeReq, time.Since(start))
		asleep()
		wakeMsg = append(wakeMsg, roundTrip(held))
	}
	t.Logf("asleep, %d each: request that wakes the space p50 %v; message on a held WebSocket that wakes it, answered, p50 %v (%+v over the wake)",
		k, pct(wakeReq, 50), pct(wakeMsg, 50), pct(wakeMsg, 50)-pct(wakeReq, 50))
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}
