// Package durbench prints the cost of durability bucket (docs/durability.md: every answer
// waits until the commits before it are in the space's log in the bucket) side by side
// with durability checkpoint, in one run, on one real box: lchat-caddy with two demo
// kinds that differ only in their durability, one space of each, its bucket a versitygw
// reached through a link that counts the box's requests and can add latency
// (link_test.go). The two spaces are measured in alternating blocks (A,B then B,A), so
// the machine's noise falls on both alike:
//
//   - the write latency p50/p99 of POST /api/messages, one writer, on the local versitygw
//     and with 20 ms added to each bucket request;
//   - the throughput of one space under 64 concurrent writers, both links;
//   - the bucket requests per write of each space writing 10 messages a second together for
//     a while (its periodic checkpoints included), and from them the monthly request bill
//     of such a space at S3 Standard prices.
//
// It asserts only what noise cannot change: every write answered 201, the bucket space's
// writes in its log (segments, log PUTs), none for the checkpoint space. Short form (CI, a
// few seconds) by default; the figures of docs/durability-figures.md:
//
//	LCHAT_DUR_BENCH=full go test ./tests/durbench -run TestDurabilityFigures -v -timeout 20m
package durbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// S3 Standard request prices (us-east-1), dollars per request.
const (
	pricePUT = 0.005 / 1000
	priceGET = 0.0004 / 1000
	month    = 30 * 24 * time.Hour
)

// shape is how much the run measures.
type shape struct {
	rounds, block, linkBlock int           // latency: rounds of one block per space, writes per block (local, linked)
	tputRounds               int           // throughput: rounds per link
	tputBlock                time.Duration // throughput: one block's length
	steady                   time.Duration // requests per write: how long both spaces take 10 writes/s
}

var (
	short = shape{rounds: 2, block: 8, linkBlock: 4, tputRounds: 1, tputBlock: 500 * time.Millisecond, steady: 2 * time.Second}
	full  = shape{rounds: 6, block: 50, linkBlock: 25, tputRounds: 4, tputBlock: 3 * time.Second, steady: 150 * time.Second}
)

const (
	writers  = 64
	rate     = 10 // writes per second in the steady phase
	addedRTT = 20 * time.Millisecond
)

// space is one demo room on the box.
type space struct {
	name, host string
	client     *http.Client
	box        *harness.Box
	n          atomic.Int64 // messages posted, for unique texts
	failed     atomic.Int64 // writes not answered 201
	lastErr    atomic.Value // string
}

// post sends one message and returns how long its answer took; a write not answered 201
// is counted as failed.
func (s *space) post() (time.Duration, bool) {
	body := fmt.Sprintf(`{"author":"bench","text":"message %d from the durability figures, about as long as a chat line"}`, s.n.Add(1))
	start := time.Now()
	resp, err := s.client.Post(s.box.URL(s.host, "/api/messages"), "application/json", strings.NewReader(body))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	d := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusCreated {
		s.failed.Add(1)
		if err != nil {
			s.lastErr.Store(err.Error())
		} else {
			s.lastErr.Store(resp.Status)
		}
		return d, false
	}
	return d, true
}

// latencies posts n messages one after another.
func (s *space) latencies(n int) []time.Duration {
	out := make([]time.Duration, 0, n)
	for range n {
		d, _ := s.post()
		out = append(out, d)
	}
	return out
}

// throughput keeps writers concurrent writers posting for d and returns the writes
// answered 201, the time until the last answer, and each write's latency.
func (s *space) throughput(d time.Duration) (int, time.Duration, []time.Duration) {
	var ok atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	start := time.Now()
	deadline := start.Add(d)
	for range writers {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				d, good := s.post()
				if good {
					ok.Add(1)
				}
				mine = append(mine, d)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return int(ok.Load()), time.Since(start), lat
}

// putProbe times n PUTs of a 1 KiB object with If-None-Match through the link: what one
// log segment of a chat message costs at least, the target of a write's added latency.
func putProbe(t *testing.T, b bucket.Bucket, n int, seq *int) []time.Duration {
	body := bytes.Repeat([]byte("x"), 1024)
	out := make([]time.Duration, 0, n)
	for range n {
		*seq++
		start := time.Now()
		if _, err := b.Put(context.Background(), fmt.Sprintf("probe/%d", *seq), bytes.NewReader(body), int64(len(body)), bucket.Cond{IfNoneMatch: true}); err != nil {
			t.Fatalf("probe PUT: %v", err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// paced posts rate messages a second, each on its own goroutine at its tick, for d.
func (s *space) paced(d time.Duration, wg *sync.WaitGroup) {
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	end := time.Now().Add(d)
	for now := range tick.C {
		if now.After(end) {
			return
		}
		wg.Go(func() { s.post() })
	}
}

// logStatus is the space's log as /lchat/status gives it (engine.DurableStatus).
type logStatus struct {
	Segments uint64 `json:"segments"`
	Failed   uint64 `json:"failed"`
	Standby  *struct {
		Box      string `json:"box"`
		Streamed uint64 `json:"streamed"`
		Lost     uint64 `json:"lost"`
	} `json:"standby"`
}

func (s *space) log(t *testing.T) logStatus {
	var st struct {
		Spaces []struct {
			Host       string     `json:"host"`
			Durability string     `json:"durability"`
			Log        *logStatus `json:"log"`
		} `json:"spaces"`
	}
	s.box.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	for _, sp := range st.Spaces {
		if sp.Host == s.host && sp.Log != nil {
			return *sp.Log
		}
	}
	return logStatus{}
}

// order is a then b in even rounds, b then a in odd ones.
func order(round int, a, b *space) []*space {
	if round%2 == 0 {
		return []*space{a, b}
	}
	return []*space{b, a}
}

// alternate runs f on a and b in rounds, in order's order.
func alternate(rounds int, a, b *space, f func(*space)) {
	for i := range rounds {
		for _, s := range order(i, a, b) {
			f(s)
		}
	}
}

func pct(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[min(len(v)-1, int(float64(len(v))*p))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func TestDurabilityFigures(t *testing.T) {
	sh := short
	if os.Getenv("LCHAT_DUR_BENCH") == "full" {
		sh = full
	}
	s3 := harness.StartS3(t)
	link := startLink(t, s3.Endpoint)
	env := s3.Env("durbench/")
	for i, kv := range env {
		if strings.HasPrefix(kv, "AWS_ENDPOINT_URL_S3=") {
			env[i] = "AWS_ENDPOINT_URL_S3=" + link.URL()
		}
	}
	kind := func(durability string) map[string]any {
		return harness.DemoKind(map[string]any{"durability": durability, "idle_timeout": "1h"})
	}
	cfg := harness.Config{Lchat: map[string]any{"kinds": map[string]any{
		"bucket": kind("bucket"), "checkpoint": kind("checkpoint"),
	}}}
	box := harness.StartBox(t, harness.BoxOptions{JSON: cfg.JSON(), Env: env})
	pcfg := s3.Config("durbench-probe/")
	pcfg.Endpoint = link.URL()
	probe, err := s3bucket.New(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	probeSeq := 0
	putProbe(t, probe, 3, &probeSeq) // its connection
	client := box.Client()
	client.Timeout = 30 * time.Second
	bkt := &space{name: "bucket", host: "bucket.durbench.test", client: client, box: box}
	ckp := &space{name: "checkpoint", host: "checkpoint.durbench.test", client: client, box: box}
	for _, s := range []*space{bkt, ckp} {
		box.AdminJSON("POST", "/lchat/routes", map[string]any{"host": s.host, "kind": s.name}, http.StatusCreated, nil)
		s.latencies(5) // wakes it, warms its connections
	}

	var out strings.Builder
	logf := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	defer func() { t.Log("\n" + out.String()) }()
	logf("durability bucket against checkpoint on one box (demo room, POST /api/messages), load average at the start %s, %d CPUs", loadavg(), runtime.NumCPU())

	// 1. Latency, one writer, blocks alternated.
	type lat struct{ local, linked map[string][]time.Duration }
	l := lat{local: map[string][]time.Duration{}, linked: map[string][]time.Duration{}}
	// One PUT of 1 KiB through the same link, a block of them after each round's two.
	for _, phase := range []struct {
		rtt   time.Duration
		block int
		into  map[string][]time.Duration
	}{{0, sh.block, l.local}, {addedRTT, sh.linkBlock, l.linked}} {
		link.SetLatency(phase.rtt)
		alternate(1, bkt, ckp, func(s *space) { s.latencies(phase.block / 2) }) // warm, not kept
		for i := range sh.rounds {
			for _, s := range order(i, bkt, ckp) {
				phase.into[s.name] = append(phase.into[s.name], s.latencies(phase.block)...)
			}
			phase.into["PUT"] = append(phase.into["PUT"], putProbe(t, probe, phase.block, &probeSeq)...)
		}
	}

	// 2. Throughput, 64 writers, blocks alternated, on each link.
	type tput struct {
		writes int
		took   time.Duration
		lat    []time.Duration
		req    requests
	}
	tp := map[string]map[string]*tput{}
	for _, rtt := range []time.Duration{0, addedRTT} {
		link.SetLatency(rtt)
		key := "local"
		if rtt > 0 {
			key = "linked"
		}
		tp[key] = map[string]*tput{"bucket": {req: requests{}}, "checkpoint": {req: requests{}}}
		alternate(sh.tputRounds, bkt, ckp, func(s *space) {
			before := link.snapshot()
			n, d, lat := s.throughput(sh.tputBlock)
			r := tp[key][s.name]
			r.writes, r.took, r.lat = r.writes+n, r.took+d, append(r.lat, lat...)
			for op, c := range since(before, link.snapshot(), s.host) {
				r.req[op] += c
			}
		})
	}
	link.SetLatency(0)

	// 3. Steady state: both spaces at 10 writes/s together, requests counted by space.
	before := link.snapshot()
	segsBefore := bkt.log(t).Segments
	nb, nc := bkt.n.Load(), ckp.n.Load()
	var wg sync.WaitGroup
	start := time.Now()
	var pacers sync.WaitGroup
	for _, s := range []*space{bkt, ckp} {
		pacers.Go(func() { s.paced(sh.steady, &wg) })
	}
	pacers.Wait()
	wg.Wait()
	steadyTook := time.Since(start)
	after := link.snapshot()
	steadyWrites := map[string]int64{"bucket": bkt.n.Load() - nb, "checkpoint": ckp.n.Load() - nc}
	segs := bkt.log(t).Segments - segsBefore

	// The table.
	row := func(what, a, b, ratio string) { logf("  %-50s %-26s %-26s %s", what, a, b, ratio) }
	logf("")
	row("", "bucket", "checkpoint", "bucket / checkpoint")
	for _, p := range []struct {
		name string
		v    map[string][]time.Duration
	}{{"write latency, local versitygw", l.local}, {fmt.Sprintf("write latency, +%v per bucket request", addedRTT), l.linked}} {
		b, c := p.v["bucket"], p.v["checkpoint"]
		row(p.name+fmt.Sprintf(" (n=%d)", len(b)), "p50 "+ms(pct(b, .5)), "p50 "+ms(pct(c, .5)), fmt.Sprintf("%.2fx", ratio(pct(b, .5), pct(c, .5))))
		row("", "p99 "+ms(pct(b, .99)), "p99 "+ms(pct(c, .99)), fmt.Sprintf("%.2fx", ratio(pct(b, .99), pct(c, .99))))
		pp := p.v["PUT"]
		row("  one 1 KiB PUT through the same link", fmt.Sprintf("p50 %s p99 %s", ms(pct(pp, .5)), ms(pct(pp, .99))), "", fmt.Sprintf("added at p50: %s = %.2f PUTs", ms(pct(b, .5)-pct(c, .5)), ratio(pct(b, .5)-pct(c, .5), pct(pp, .5))))
	}
	for _, key := range []string{"local", "linked"} {
		b, c := tp[key]["bucket"], tp[key]["checkpoint"]
		bps, cps := float64(b.writes)/b.took.Seconds(), float64(c.writes)/c.took.Seconds()
		what := fmt.Sprintf("throughput, %d writers, local versitygw", writers)
		if key == "linked" {
			what = fmt.Sprintf("throughput, %d writers, +%v", writers, addedRTT)
		}
		row(what, fmt.Sprintf("%.0f writes/s", bps), fmt.Sprintf("%.0f writes/s", cps), fmt.Sprintf("%.2fx (target >= 0.8x)", bps/cps))
		row("  its write latency", "p50 "+ms(pct(b.lat, .5)), "p50 "+ms(pct(c.lat, .5)), fmt.Sprintf("%.2fx", ratio(pct(b.lat, .5), pct(c.lat, .5))))
		row("", "p99 "+ms(pct(b.lat, .99)), "p99 "+ms(pct(c.lat, .99)), fmt.Sprintf("%.2fx", ratio(pct(b.lat, .99), pct(c.lat, .99))))
		if puts := b.req.count("PUT log"); puts > 0 {
			row("  log PUTs per write; time per segment", fmt.Sprintf("%.3f (%d / %d); %s", float64(puts)/float64(b.writes), puts, b.writes, ms(b.took/time.Duration(puts))), "", "")
		}
		// Little's law: a write waits at least one PUT of its segment, so 64 writers can
		// never take more than 64 / (PUT p50) writes a second, whatever the gate does.
		pp := l.local["PUT"]
		if key == "linked" {
			pp = l.linked["PUT"]
		}
		if put := pct(pp, .5); put > 0 {
			bound := float64(writers) / put.Seconds()
			row("  bound: writers / one PUT p50 (Little's law)", fmt.Sprintf("%.0f writes/s", bound), "", fmt.Sprintf("%.2fx at most", bound/cps))
		}
	}
	bill := map[string]float64{}
	per := map[string]requests{}
	for _, s := range []*space{bkt, ckp} {
		r := since(before, after, s.host)
		per[s.name] = r
		// Per write times 10 writes a second: the time-driven requests (checkpoints) are
		// then counted at the rate the space was written.
		put, get, _ := r.tiers()
		perSec := func(n int) float64 { return float64(n) / float64(max(1, steadyWrites[s.name])) * rate }
		bill[s.name] = (perSec(put)*pricePUT + perSec(get)*priceGET) * month.Seconds()
	}
	pw := func(name string) string {
		w := steadyWrites[name]
		if w == 0 {
			return "-"
		}
		put, get, del := per[name].tiers()
		return fmt.Sprintf("%.3f PUT-tier + %.3f GET-tier; %.3f DELETE (free)", float64(put)/float64(w), float64(get)/float64(w), float64(del)/float64(w))
	}
	row(fmt.Sprintf("bucket requests per write, %d writes/s for %v", rate, steadyTook.Round(time.Second)), pw("bucket"), "", "")
	row("", "", pw("checkpoint"), "")
	row("  log segments per write (status)", fmt.Sprintf("%.3f (%d / %d)", float64(segs)/float64(max(1, steadyWrites["bucket"])), segs, steadyWrites["bucket"]), "", "")
	row(fmt.Sprintf("monthly request bill at %d writes/s, S3 Std", rate), fmt.Sprintf("$%.2f", bill["bucket"]), fmt.Sprintf("$%.2f", bill["checkpoint"]), fmt.Sprintf("+$%.2f a month", bill["bucket"]-bill["checkpoint"]))
	for _, s := range []*space{bkt, ckp} {
		logf("  %s space's requests in the steady phase: %s", s.name, opsString(per[s.name]))
	}
	logf("  the box's own requests (not a space's) in the steady phase: %s", opsString(since(before, after, "")))
	logf("load average at the end %s", loadavg())

	// What noise cannot change.
	if n := bkt.log(t).Failed; n > 0 {
		t.Errorf("the bucket space's gate refused %d answers (503)", n)
	}
	for _, s := range []*space{bkt, ckp} {
		if n := s.failed.Load(); n > 0 {
			t.Errorf("%s: %d of %d writes not answered 201 (last: %v)", s.name, n, s.n.Load(), s.lastErr.Load())
		}
	}
	if segs == 0 || per["bucket"].count("PUT log") == 0 {
		t.Errorf("the bucket space's writes landed no log segments (%d in its status, %d log PUTs seen)", segs, per["bucket"].count("PUT log"))
	}
	if n := per["checkpoint"].count("PUT log"); n > 0 {
		t.Errorf("the checkpoint space wrote %d log segments", n)
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// opsString lists requests by operation, most first.
func opsString(r requests) string {
	ops := make([]string, 0, len(r))
	for op := range r {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return r[ops[i]] > r[ops[j]] || r[ops[i]] == r[ops[j]] && ops[i] < ops[j] })
	var parts []string
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%s %d", op, r[op]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
