// Package meshbench measures the mesh with real lchat-caddy processes on versitygw and
// prints the figures (it asserts no timings): forwarded against direct requests, and
// the bucket requests a box makes per hour, idle and with awake spaces.
//
//	go test ./tests/meshbench/ -run . -v
package meshbench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	domain = "bench.test"
	token  = "bench-token-0b1c2d-3e4f5a6b7c8d9e0f1a2b"
)

// countingS3 is a reverse proxy in front of versitygw that counts requests by kind.
type countingS3 struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func newCountingS3(t *testing.T, endpoint string) *countingS3 {
	u, _ := url.Parse(endpoint)
	rp := httputil.NewSingleHostReverseProxy(u)
	c := &countingS3{hits: map[string]int{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := r.Method
		if r.Method == http.MethodGet && r.URL.Query().Has("list-type") {
			kind = "LIST"
		}
		c.mu.Lock()
		c.hits[kind]++
		c.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *countingS3) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.hits))
	for k, v := range c.hits {
		out[k] = v
	}
	return out
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func diff(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

type box struct {
	*harness.Box
	addr, self string
	s3         *countingS3
}

// startBox starts a plain-HTTP mesh box (SELF http://127.0.0.x:port) whose bucket
// traffic goes through its own counting proxy, running the demo space.
func startBox(t *testing.T, s3 *harness.S3, prefix string, i int, beat, replication string) *box {
	return startBoxKinds(t, s3, prefix, i, beat, map[string]any{"demo": map[string]any{
		"command": "{self}", "args": []string{"demo-space"}, "ready_path": "/healthz",
		"idle_timeout": "1h", "replication": map[string]any{"class": "periodic", "interval": replication},
	}})
}

// startBoxKinds is startBox with the given kinds.
func startBoxKinds(t *testing.T, s3 *harness.S3, prefix string, i int, beat string, kinds map[string]any) *box {
	ip := fmt.Sprintf("127.0.0.%d", i+1)
	b := &box{addr: net.JoinHostPort(ip, harness.FreePort(t, ip))}
	b.self = "http://" + b.addr
	b.s3 = newCountingS3(t, s3.Endpoint)
	js := harness.Config{
		Listen: b.addr,
		Lchat: map[string]any{
			"wake_scan_interval": beat,
			"mesh":               map[string]any{"beat": beat, "dead_after": "3s"},
			"kinds":              kinds,
		},
		MeshAPIHost: ip,
	}.JSON()
	env := s3.Env(prefix)
	for j, kv := range env {
		if strings.HasPrefix(kv, "AWS_ENDPOINT_URL_S3=") {
			env[j] = "AWS_ENDPOINT_URL_S3=" + b.s3.srv.URL
		}
	}
	env = append(env, mesh.EnvSelf+"="+b.self, mesh.EnvDomains+"="+domain, mesh.EnvToken+"="+token)
	b.Box = harness.StartBox(t, harness.BoxOptions{JSON: js, Env: env, IP: ip})
	return b
}

func (b *box) client() *http.Client {
	d := &net.Dialer{}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return d.DialContext(ctx, n, b.addr)
		},
		MaxIdleConnsPerHost: 64,
	}, Timeout: time.Minute}
}

func (b *box) get(host, path string) (int, error) {
	resp, err := b.client().Get("http://" + host + path)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func ownedBy(want string, selves []string, tag string) string {
	var ms []mesh.Member
	for _, s := range selves {
		ms = append(ms, mesh.Member{Self: s})
	}
	for i := 0; ; i++ {
		h := fmt.Sprintf("%s%d.%s", tag, i, domain)
		if o, _ := mesh.Owner(h, ms, ""); o.Self == want {
			return h
		}
	}
}

func waitLive(t *testing.T, n int, boxes ...*box) {
	t.Helper()
	for _, b := range boxes {
		var st struct {
			Mesh struct {
				Live []string `json:"live_members"`
			} `json:"mesh"`
		}
		harness.WaitFor(t, 10*time.Second, fmt.Sprintf("%s to see %d live members", b.self, n), func() bool {
			b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
			return len(st.Mesh.Live) == n
		}, func() string { return fmt.Sprintf("it sees %v", st.Mesh.Live) })
	}
}

// load runs conc workers against host through b for d and returns requests/s and p50.
func load(b *box, host string, conc int, d time.Duration) (float64, time.Duration, int) {
	c := b.client()
	var n, errs atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(end) {
				s := time.Now()
				resp, err := c.Get("http://" + host + "/healthz")
				if err != nil || resp.StatusCode != 200 {
					errs.Add(1)
					if resp != nil {
						resp.Body.Close()
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(s))
				n.Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	var p50 time.Duration
	if len(lat) > 0 {
		p50 = lat[len(lat)/2]
	}
	return float64(n.Load()) / d.Seconds(), p50, int(errs.Load())
}

// TestForwardedVsDirect: the same awake space, requested through its owner (direct)
// and through a non-owner (one forward hop).
func TestForwardedVsDirect(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	s3 := harness.StartS3(t)
	prefix := fmt.Sprintf("fb%d", time.Now().UnixNano()%1e9)
	a := startBox(t, s3, prefix, 0, "1s", "60s")
	b := startBox(t, s3, prefix, 1, "1s", "60s")
	waitLive(t, 2, a, b)
	host := ownedBy(a.self, []string{a.self, b.self}, "fw")
	a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, 201, nil)
	harness.WaitFor(t, 10*time.Second, "the route's fan-out to b", func() bool {
		code, _, err := b.Admin("GET", "/lchat/routes/"+host, nil)
		return err == nil && code == http.StatusOK
	})
	if code, err := a.get(host, "/healthz"); err != nil || code != 200 {
		t.Fatalf("waking: %d %v", code, err)
	}
	for _, conc := range []int{1, 8} {
		load(a, host, conc, 500*time.Millisecond) // warm up
		load(b, host, conc, 500*time.Millisecond)
		dRPS, dP50, dErr := load(a, host, conc, 3*time.Second)
		fRPS, fP50, fErr := load(b, host, conc, 3*time.Second)
		t.Logf("FIGURE concurrency %d: direct %.0f req/s p50 %v; forwarded %.0f req/s p50 %v; ratio forwarded/direct %.2f; added p50 %v (errors %d/%d)",
			conc, dRPS, dP50, fRPS, fP50, fRPS/dRPS, fP50-dP50, dErr, fErr)
		if dErr+fErr > 0 {
			t.Errorf("requests failed: direct %d, forwarded %d", dErr, fErr)
		}
	}
}

// TestBucketRequestsPerHour counts every request a box sends to the bucket over a
// window, idle and with awake (idle) spaces, and extrapolates to an hour.
func TestBucketRequestsPerHour(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	const window = 10 * time.Second
	s3 := harness.StartS3(t)
	prefix := fmt.Sprintf("rq%d", time.Now().UnixNano()%1e9)
	a := startBox(t, s3, prefix, 0, "1s", "1s")
	b := startBox(t, s3, prefix, 1, "1s", "1s")
	waitLive(t, 2, a, b)

	measure := func(label string, spaces int) {
		before := a.s3.snapshot()
		time.Sleep(window)
		d := diff(before, a.s3.snapshot())
		perHour := float64(total(d)) * float64(time.Hour) / float64(window)
		keys := make([]string, 0, len(d))
		for k := range d {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%d", k, d[k]))
		}
		t.Logf("FIGURE %s (%d awake spaces, beat 1s, wake scan 1s, periodic sync 1s): %d bucket requests in %v [%s] = %.0f per box per hour; at the default 15s beat/30s scan the same shape is %.0f per hour",
			label, spaces, total(d), window, strings.Join(parts, " "), perHour, 3600.0/15*2+3600.0/30)
	}
	measure("idle box", 0)

	const n = 20
	var hosts []string
	for i := 0; len(hosts) < n; i++ {
		h := ownedBy(a.self, []string{a.self, b.self}, fmt.Sprintf("s%d-", i))
		a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": h, "kind": "demo"}, 201, nil)
		hosts = append(hosts, h)
	}
	for _, h := range hosts {
		if code, err := a.get(h, "/healthz"); err != nil || code != 200 {
			t.Fatalf("waking %s: %d %v", h, code, err)
		}
	}
	time.Sleep(3 * time.Second) // first syncs of the fresh spaces settle
	measure("box with awake idle spaces", n)
}

// buildTiny builds tests/meshbench/tinyspace, the lightest instance there is.
func buildTiny(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tinyspace")
	cmd := exec.Command("go", "build", "-o", out, "./tests/meshbench/tinyspace")
	cmd.Dir = harness.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building tinyspace: %v\n%s", err, b)
	}
	return out
}

type spacesStatus struct {
	Spaces []struct {
		Host     string     `json:"host"`
		State    string     `json:"state"`
		LastSync *time.Time `json:"last_sync"`
	} `json:"spaces"`
}

// TestBucketRequestsPerHourScaling counts a box's bucket requests over a window with
// 0 and 20 awake spaces (and, with LCHAT_BENCH_SPACES=1000, with 1,000), each space a
// real process (tinyspace) synced periodically, and prints them side by side. The
// total must not grow with the number of spaces: per beat one heartbeat PUT and one
// members LIST, one wakes LIST per scan, and nothing for the periodic sync of a space
// whose files did not change.
//
//	LCHAT_BENCH_SPACES=1000 go test ./tests/meshbench/ -run Scaling -v -timeout 30m
func TestBucketRequestsPerHourScaling(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	sizes := []int{0, 20}
	if n, _ := strconv.Atoi(os.Getenv("LCHAT_BENCH_SPACES")); n > 20 {
		sizes = append(sizes, n)
	}
	const (
		window   = 20 * time.Second
		interval = 10 * time.Second // periodic sync: every space syncs about twice per window
	)
	tiny := buildTiny(t)
	s3 := harness.StartS3(t)
	prefix := fmt.Sprintf("sc%d", time.Now().UnixNano()%1e9)
	kinds := map[string]any{"tiny": map[string]any{
		"command": tiny, "idle_timeout": "1h", "stop_grace": "2s",
		"env":         map[string]string{"GOMAXPROCS": "1"},
		"replication": map[string]any{"class": "periodic", "interval": interval.String()},
	}}
	a := startBoxKinds(t, s3, prefix, 0, "1s", kinds)
	b := startBoxKinds(t, s3, prefix, 1, "1s", kinds)
	waitLive(t, 2, a, b)

	status := func() map[string]time.Time {
		var st spacesStatus
		a.AdminJSON("GET", "/lchat/status", nil, 200, &st)
		out := map[string]time.Time{}
		for _, s := range st.Spaces {
			if s.State == "awake" {
				out[s.Host] = time.Time{}
				if s.LastSync != nil {
					out[s.Host] = *s.LastSync
				}
			}
		}
		return out
	}
	type row struct {
		spaces, total, synced int
		perHour               float64
		detail                string
		setup                 time.Duration
	}
	var rows []row
	var hosts []string
	for _, n := range sizes {
		setup := time.Now()
		fresh := hosts[len(hosts):]
		for i := len(hosts); len(hosts) < n; i++ {
			h := ownedBy(a.self, []string{a.self, b.self}, fmt.Sprintf("t%d-", i))
			a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": h, "kind": "tiny"}, 201, nil)
			hosts = append(hosts, h)
			fresh = append(fresh, h)
		}
		work := make(chan string)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for h := range work {
					if code, err := a.get(h, "/"); err != nil || code != 200 {
						failed.Add(1)
						t.Logf("waking %s: %d %v", h, code, err)
					}
				}
			}()
		}
		for _, h := range fresh {
			work <- h
		}
		close(work)
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("%d wakes failed", failed.Load())
		}
		// Settle: every space awake and synced once (its first manifest), plus a beat.
		deadline := time.Now().Add(5 * time.Minute)
		for {
			st := status()
			synced := 0
			for _, ls := range st {
				if !ls.IsZero() {
					synced++
				}
			}
			if len(st) == n && synced == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d spaces: %d awake, %d synced after 5 minutes", n, len(st), synced)
			}
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond)
		setupTook := time.Since(setup)

		first, before := status(), a.s3.snapshot()
		time.Sleep(window)
		d := diff(before, a.s3.snapshot())
		synced := 0
		for h, ls := range status() {
			if ls.After(first[h]) {
				synced++
			}
		}
		keys := make([]string, 0, len(d))
		for k := range d {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%d", k, d[k]))
		}
		rows = append(rows, row{spaces: n, total: total(d), synced: synced, detail: strings.Join(parts, " "),
			perHour: float64(total(d)) * float64(time.Hour) / float64(window), setup: setupTook})
	}
	t.Logf("FIGURE bucket requests per box per hour (beat 1s, wake scan 1s, periodic sync %v, window %v, tinyspace instances):", interval, window)
	t.Logf("FIGURE %12s %10s %12s %16s  %s", "awake", "in window", "per hour", "spaces synced", "by kind (setup)")
	for _, r := range rows {
		t.Logf("FIGURE %12d %10d %12.0f %16d  [%s] (%v)", r.spaces, r.total, r.perHour, r.synced, r.detail, r.setup.Round(time.Second))
	}
	t.Logf("FIGURE at the default 15s beat and 30s wake scan the same shape is %.0f per box per hour, whatever the number of spaces", 3600.0/15*2+3600.0/30)
	idle := rows[0].total
	for _, r := range rows[1:] {
		if r.synced < r.spaces {
			t.Errorf("%d spaces: only %d synced in the window; the figure does not show the sync cost", r.spaces, r.synced)
		}
		if r.total > idle+idle/10+5 {
			t.Errorf("%d awake unchanged spaces: %d requests in the window against %d idle; the cost grows with the number of spaces", r.spaces, r.total, idle)
		}
	}
}
