package providers

import (
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestProviderHopFigures (opt-in: LCHAT_PROVIDER_BENCH=1) measures what the seam costs:
// the latency of a request through fleet A to a space of its own beside one delegated to
// fleet B (the extra hop: A's box to B's box over TLS), p50 and p99 of n sequential GETs
// of the room's messages, both spaces awake; and how long a delegate and a reclaim of a
// small space take. docs/providers.md and docs/figures.md quote it.
func TestProviderHopFigures(t *testing.T) {
	if os.Getenv("LCHAT_PROVIDER_BENCH") == "" {
		t.Skip("set LCHAT_PROVIDER_BENCH=1 to measure the provider hop")
	}
	const n = 500
	a, _ := twoFleets(t)
	a1 := a.nodes[0]
	const own, out = "own." + domainA, "out." + domainA
	a.createSpace(a1, own)
	a.createSpace(a1, out)
	a.post(a1, own, "hello")
	a.post(a1, out, "hello")
	start := time.Now()
	if o, err := a1.CLI("delegate", out, "--to", "partner"); err != nil {
		t.Fatalf("delegate: %v\n%s", err, o)
	}
	delegate := time.Since(start)
	cl := a.client(a1)
	measure := func(host string) []time.Duration {
		var ds []time.Duration
		for i := 0; i < n+20; i++ {
			req, _ := http.NewRequest(http.MethodGet, "https://"+host+"/api/messages", nil)
			t0 := time.Now()
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var sb strings.Builder
			buf := make([]byte, 4096)
			for {
				k, err := resp.Body.Read(buf)
				sb.Write(buf[:k])
				if err != nil {
					break
				}
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d", host, resp.StatusCode)
			}
			if i >= 20 { // the first wake and connections aside
				ds = append(ds, time.Since(t0))
			}
		}
		slices.Sort(ds)
		return ds
	}
	pct := func(ds []time.Duration, p float64) time.Duration { return ds[int(float64(len(ds)-1)*p)] }
	for round := 0; round < 2; round++ {
		o, d := measure(own), measure(out)
		t.Logf("round %d, %d GETs each: own space p50 %v p99 %v | delegated p50 %v p99 %v | extra hop p50 +%v p99 +%v",
			round+1, n, pct(o, .5).Round(10*time.Microsecond), pct(o, .99).Round(10*time.Microsecond),
			pct(d, .5).Round(10*time.Microsecond), pct(d, .99).Round(10*time.Microsecond),
			(pct(d, .5) - pct(o, .5)).Round(10*time.Microsecond), (pct(d, .99) - pct(o, .99)).Round(10*time.Microsecond))
	}
	start = time.Now()
	if o, err := a1.CLI("reclaim", out); err != nil {
		t.Fatalf("reclaim: %v\n%s", err, o)
	}
	t.Logf("delegate %v, reclaim %v (a space of one message; CLI round trip included)", delegate.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
