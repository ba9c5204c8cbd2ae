// Package bench prints figures: the proxy overhead of `lchat` against Caddy's plain
// reverse_proxy to the same awake instance, and the registry at 100,000 routes.
// Run: go test ./tests/bench -run . -v   (skipped with -short)
// With LCHAT_BENCH_CPUPROFILE=<file>, TestProxyOverhead also saves CPU profiles of the
// server (its admin API's /debug/pprof/profile) taken during an extra lchat round (<file>)
// and an extra reverse_proxy round (<file>.plain);
// read it with `go tool pprof bin/lchat-caddy <file>`.
package bench

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/tests/harness"
)

func config(plainDial string, plainPort string) string {
	c := harness.Config{
		Bucket:   map[string]any{"backend": "file", "root": "{$LCHAT_TEST_DIR}/bucket"},
		LogLevel: "WARN",
		Lchat: map[string]any{"kinds": map[string]any{"demo": map[string]any{
			"command": "{self}", "args": []string{"demo-space"}, "ready_path": "/healthz",
		}}},
	}
	if plainDial != "" {
		c.Servers = map[string]any{"plain": map[string]any{
			"listen":          []string{"127.0.0.1:" + plainPort},
			"automatic_https": map[string]any{"disable": true},
			"routes": []any{map[string]any{"handle": []any{map[string]any{
				"handler": "reverse_proxy", "flush_interval": -1,
				"upstreams": []any{map[string]any{"dial": plainDial}},
			}}}},
		}}
	}
	return c.JSON()
}

type result struct {
	n    int
	dur  time.Duration
	lats []time.Duration
	errs int
}

func (r *result) rps() float64 { return float64(r.n) / r.dur.Seconds() }
func (r *result) pct(p float64) time.Duration {
	slices.Sort(r.lats)
	return r.lats[int(float64(len(r.lats)-1)*p)]
}

// load runs workers keep-alive clients against url for d.
func load(addr, host, path string, workers int, d time.Duration) *result {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: workers,
	}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	res := &result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lats []time.Duration
			errs := 0
			for time.Now().Before(deadline) {
				t0 := time.Now()
				resp, err := client.Get("http://" + host + path)
				if err != nil {
					errs++
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs++
					continue
				}
				lats = append(lats, time.Since(t0))
			}
			mu.Lock()
			res.lats = append(res.lats, lats...)
			res.errs += errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.dur = time.Since(start)
	res.n = len(res.lats)
	return res
}

func TestProxyOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark harness")
	}
	b := harness.StartBox(t, harness.BoxOptions{JSON: config("", "")})
	const host = "bench.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, 201, nil)
	resp, err := b.Client().Get(b.URL(host, "/healthz"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("waking: %v", err)
	}
	resp.Body.Close()

	// The instance's socket, found where the engine put it.
	var sock string
	filepath.WalkDir(filepath.Join(b.Dir, "state"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 {
			sock = p
		}
		return nil
	})
	if sock == "" {
		t.Fatal("no instance socket under the state dir")
	}
	plainPort := harness.FreePort(t, "127.0.0.1")
	if err := b.Reload(config("unix/"+sock, plainPort), true); err != nil {
		t.Fatal(err)
	}

	// Short rounds in pairs, the order alternating (plain first, then lchat first), so
	// a drift in the machine's load (other processes on a shared box) weighs on both
	// sides alike instead of on whichever always runs second.
	const workers = 16
	const pairs = 6
	round := 2 * time.Second
	var viaLchat, viaPlain []*result
	for i := 0; i < pairs; i++ {
		if i%2 == 0 {
			viaPlain = append(viaPlain, load("127.0.0.1:"+plainPort, host, "/api/messages", workers, round))
			viaLchat = append(viaLchat, load(b.HTTPAddr, host, "/api/messages", workers, round))
		} else {
			viaLchat = append(viaLchat, load(b.HTTPAddr, host, "/api/messages", workers, round))
			viaPlain = append(viaPlain, load("127.0.0.1:"+plainPort, host, "/api/messages", workers, round))
		}
	}
	merge := func(rs []*result) *result {
		m := &result{}
		for _, r := range rs {
			m.n += r.n
			m.dur += r.dur
			m.errs += r.errs
			m.lats = append(m.lats, r.lats...)
		}
		return m
	}
	lc, pl := merge(viaLchat), merge(viaPlain)
	if lc.errs+pl.errs > 0 {
		t.Errorf("errors: lchat %d, plain %d", lc.errs, pl.errs)
	}
	fmt.Printf("proxy overhead, GET /api/messages on an awake demo space, %d workers, %d x %v rounds each, in pairs of alternating order, GOMAXPROCS=%d\n",
		workers, pairs, round, runtime.GOMAXPROCS(0))
	fmt.Printf("  reverse_proxy: %8.0f req/s  p50 %v  p99 %v\n", pl.rps(), pl.pct(0.5), pl.pct(0.99))
	fmt.Printf("  lchat:         %8.0f req/s  p50 %v  p99 %v\n", lc.rps(), lc.pct(0.5), lc.pct(0.99))
	fmt.Printf("  ratio: req/s %.3f (target >= 0.95)   p99 %.3f (target <= 1.10)\n",
		lc.rps()/pl.rps(), float64(lc.pct(0.99))/float64(pl.pct(0.99)))
	var rpsRatios, p99Ratios []float64
	for i := range viaLchat {
		rr, pr := viaLchat[i].rps()/viaPlain[i].rps(), float64(viaLchat[i].pct(0.99))/float64(viaPlain[i].pct(0.99))
		rpsRatios, p99Ratios = append(rpsRatios, rr), append(p99Ratios, pr)
		fmt.Printf("  pair %d: req/s ratio %.3f  p99 ratio %.3f\n", i+1, rr, pr)
	}
	slices.Sort(rpsRatios)
	slices.Sort(p99Ratios)
	fmt.Printf("  pair ratios: req/s min %.3f median %.3f max %.3f   p99 min %.3f median %.3f max %.3f\n",
		rpsRatios[0], (rpsRatios[pairs/2-1]+rpsRatios[pairs/2])/2, rpsRatios[pairs-1],
		p99Ratios[0], (p99Ratios[pairs/2-1]+p99Ratios[pairs/2])/2, p99Ratios[pairs-1])

	if out := os.Getenv("LCHAT_BENCH_CPUPROFILE"); out != "" {
		for _, r := range []struct{ name, addr, file string }{
			{"lchat", b.HTTPAddr, out},
			{"reverse_proxy", "127.0.0.1:" + plainPort, out + ".plain"},
		} {
			done := make(chan error, 1)
			go func() {
				status, data, err := b.Admin("GET", "/debug/pprof/profile?seconds=8", nil)
				if err == nil && status != 200 {
					err = fmt.Errorf("profile: status %d: %s", status, data)
				}
				if err == nil {
					err = os.WriteFile(r.file, data, 0o644)
				}
				done <- err
			}()
			res := load(r.addr, host, "/api/messages", workers, 10*time.Second)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			fmt.Printf("  server CPU profile of a %s round (%.0f req/s, %d requests): %s\n", r.name, res.rps(), res.n, r.file)
		}
	}
}

func TestRegistry100k(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark harness")
	}
	const n = 100000
	path := filepath.Join(t.TempDir(), "reg.db")
	g, err := registry.Open(path, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 10000 {
		var rts []registry.Route
		for j := i; j < i+10000; j++ {
			rts = append(rts, registry.Route{Host: fmt.Sprintf("s%06d.example.com", j), Kind: "demo", Hibernate: true,
				Version: "1", Env: map[string]string{"ADMIN_TOKEN": "0123456789abcdef0123456789abcdef"}})
		}
		if err := g.PutMany(rts); err != nil {
			t.Fatal(err)
		}
	}
	g.Close()
	st, _ := os.Stat(path)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	g, err = registry.Open(path, registry.Options{})
	load := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)

	hosts := make([]string, 4096)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%06d.example.com", (i*7919)%n)
	}
	single := testing.Benchmark(func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			g.Lookup(hosts[i&4095])
		}
	})
	parallel := testing.Benchmark(func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				g.Lookup(hosts[i&4095])
				i++
			}
		})
	})
	fmt.Printf("registry with %d routes (file %.1f MB)\n", g.Len(), float64(st.Size())/1e6)
	fmt.Printf("  start-up load: %v\n", load)
	fmt.Printf("  heap held:     %.1f MB (%.0f bytes/route)\n", float64(after.HeapAlloc-before.HeapAlloc)/1e6, float64(after.HeapAlloc-before.HeapAlloc)/n)
	fmt.Printf("  lookup:        %.1f ns/op (1 goroutine), %.1f ns/op (parallel, GOMAXPROCS=%d)\n",
		float64(single.T.Nanoseconds())/float64(single.N), float64(parallel.T.Nanoseconds())/float64(parallel.N), runtime.GOMAXPROCS(0))
}
