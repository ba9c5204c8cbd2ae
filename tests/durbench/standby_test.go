package durbench

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestStandbyFigures prints the cost of durability standby (engine/standby.go: every answer
// waits until the commits before it are fsynced in the spool of the space's standby box;
// the bucket log follows about once a second) side by side with checkpoint and bucket, in
// one run: two real lchat-caddy boxes in a plain-HTTP mesh on loopback sharing one
// versitygw bucket through the counting link (link_test.go), three demo kinds that differ
// only in their durability, one space of each, all three awake on the first box (the
// second is the standby space's standby). The three spaces are measured in rotated blocks
// (A,B,C then B,C,A then C,A,B), so the machine's noise falls on all alike:
//
//   - the write latency p50/p99 of POST /api/messages, one writer, on the local versitygw
//     and with 20 ms added to each bucket request, and what each adds to checkpoint's;
//   - the throughput of one space under 64 concurrent writers, both links, as a ratio to
//     checkpoint's, with the bucket PUTs each space sent per second meanwhile;
//   - the bucket PUTs per second of each space writing 10 messages a second together for a
//     while (its periodic checkpoints included).
//
// It asserts only what noise cannot change: every write answered 201, no answer refused by
// a gate, the standby space's stream on the second box and never given up, the bucket and
// standby spaces' writes in their bucket logs. Short form (CI, a few seconds) by default;
// the figures of docs/durability-figures.md ("Standby"):
//
//	LCHAT_DUR_BENCH=full go test ./tests/durbench -run TestStandbyFigures -v -timeout 20m
func TestStandbyFigures(t *testing.T) {
	sh := shape{rounds: 3, block: 6, linkBlock: 3, tputRounds: 1, tputBlock: 400 * time.Millisecond, steady: 2 * time.Second}
	if os.Getenv("LCHAT_DUR_BENCH") == "full" {
		sh = shape{rounds: 6, block: 50, linkBlock: 25, tputRounds: 3, tputBlock: 3 * time.Second, steady: 60 * time.Second}
	}
	s3 := harness.StartS3(t)
	link := startLink(t, s3.Endpoint)
	kind := func(durability string) map[string]any {
		return harness.DemoKind(map[string]any{"durability": durability, "idle_timeout": "1h"})
	}
	kinds := map[string]any{"checkpoint": kind("checkpoint"), "bucket": kind("bucket"), "standby": kind("standby")}
	holder := startMeshBox(t, s3, link, 0, kinds)
	other := startMeshBox(t, s3, link, 1, kinds)
	parts := cpuParts{holder: holder.PID(), other: other.PID(), bucket: s3.PID()}
	split := splitCPUs(t, parts) // before any instance starts: they inherit the holder's CPU
	harness.WaitFor(t, 20*time.Second, "two live members", func() bool {
		var st struct {
			Mesh struct {
				Live []string `json:"live_members"`
			} `json:"mesh"`
		}
		code, data, err := holder.Admin("GET", "/lchat/status", nil)
		return err == nil && code == 200 && jsonInto(data, &st) && len(st.Mesh.Live) == 2
	})

	client := holder.Client()
	client.Timeout = 30 * time.Second
	members := []mesh.Member{{Self: selfOf(holder)}, {Self: selfOf(other)}}
	var spaces []*space
	for _, name := range []string{"checkpoint", "bucket", "standby"} {
		s := &space{name: name, host: hostOwnedBy(t, name, members, selfOf(holder)), client: client, box: holder}
		holder.AdminJSON("POST", "/lchat/routes", map[string]any{"host": s.host, "kind": name}, http.StatusCreated, nil)
		s.latencies(5) // wakes it, warms its connections
		spaces = append(spaces, s)
	}
	bkt, sby := spaces[1], spaces[2]
	if st := sby.log(t).Standby; st == nil || st.Box != selfOf(other) {
		t.Fatalf("the standby space's stream: %+v, want the other box %s", st, selfOf(other))
	}

	var out strings.Builder
	logf := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	defer func() { t.Log("\n" + out.String()) }()
	logf("durability standby against checkpoint and bucket, two boxes on loopback (demo room, POST /api/messages), load average at the start %s, %d CPUs", loadavg(), runtime.NumCPU())
	if split {
		logf("CPUs split (LCHAT_DUR_CPUS=split): the holder box and its instances on CPU 0; the standby box, the bucket server and the writers on the others")
	}

	// 1. Latency, one writer, blocks rotated, on each link.
	lat := map[string]map[string][]time.Duration{"local": {}, "linked": {}}
	for _, phase := range []struct {
		key   string
		rtt   time.Duration
		block int
	}{{"local", 0, sh.block}, {"linked", addedRTT, sh.linkBlock}} {
		link.SetLatency(phase.rtt)
		rotate(1, spaces, func(s *space) { s.latencies(phase.block / 2) }) // warm, not kept
		rotate(sh.rounds, spaces, func(s *space) { lat[phase.key][s.name] = append(lat[phase.key][s.name], s.latencies(phase.block)...) })
	}

	// 2. Throughput, 64 writers, blocks rotated, on each link.
	type tput struct {
		writes int
		took   time.Duration
		lat    []time.Duration
		req    requests
		segs   uint64    // the standby space's stream segments
		cpu    cpuSample // the CPU each part used meanwhile
	}
	tp := map[string]map[string]*tput{}
	for _, key := range []string{"local", "linked"} {
		link.SetLatency(map[string]time.Duration{"local": 0, "linked": addedRTT}[key])
		tp[key] = map[string]*tput{}
		for _, s := range spaces {
			tp[key][s.name] = &tput{req: requests{}, cpu: cpuSample{}}
		}
		rotate(sh.tputRounds, spaces, func(s *space) {
			before, segs, cpu := link.snapshot(), streamed(t, s), parts.sample()
			n, d, l := s.throughput(sh.tputBlock)
			r := tp[key][s.name]
			r.cpu.add(cpu, parts.sample())
			r.segs += streamed(t, s) - segs
			r.writes, r.took, r.lat = r.writes+n, r.took+d, append(r.lat, l...)
			for op, c := range since(before, link.snapshot(), s.host) {
				r.req[op] += c
			}
		})
	}
	link.SetLatency(0)

	// 3. Steady state: the three spaces at 10 writes/s together, requests counted by space.
	before := link.snapshot()
	var wg, pacers sync.WaitGroup
	start := time.Now()
	for _, s := range spaces {
		pacers.Go(func() { s.paced(sh.steady, &wg) })
	}
	pacers.Wait()
	wg.Wait()
	steadyTook := time.Since(start)
	after := link.snapshot()

	// The table.
	row := func(what, a, b, c, d string) { logf("  %-50s %-22s %-24s %-22s %s", what, a, b, c, d) }
	logf("")
	row("", "checkpoint", "bucket", "standby", "standby - checkpoint (target)")
	for _, key := range []string{"local", "linked"} {
		l := lat[key]
		what := "write latency, local versitygw"
		if key == "linked" {
			what = fmt.Sprintf("write latency, +%v per bucket request", addedRTT)
		}
		c, b, s := l["checkpoint"], l["bucket"], l["standby"]
		row(what+fmt.Sprintf(" (n=%d)", len(s)), "p50 "+ms(pct(c, .5)), "p50 "+ms(pct(b, .5)), "p50 "+ms(pct(s, .5)), added(pct(s, .5), pct(c, .5))+" (<= 1 ms)")
		row("", "p99 "+ms(pct(c, .99)), "p99 "+ms(pct(b, .99)), "p99 "+ms(pct(s, .99)), added(pct(s, .99), pct(c, .99))+" (<= 5 ms)")
	}
	for _, key := range []string{"local", "linked"} {
		what := fmt.Sprintf("throughput, %d writers, local versitygw", writers)
		if key == "linked" {
			what = fmt.Sprintf("throughput, %d writers, +%v", writers, addedRTT)
		}
		rate := func(name string) float64 { r := tp[key][name]; return float64(r.writes) / r.took.Seconds() }
		row(what, fmt.Sprintf("%.0f writes/s", rate("checkpoint")), fmt.Sprintf("%.0f writes/s (%.2fx)", rate("bucket"), rate("bucket")/rate("checkpoint")),
			fmt.Sprintf("%.0f writes/s", rate("standby")), fmt.Sprintf("%.2fx (>= 0.8x)", rate("standby")/rate("checkpoint")))
		p := func(name string, q float64) string { return ms(pct(tp[key][name].lat, q)) }
		row("  its write latency", "p50 "+p("checkpoint", .5), "p50 "+p("bucket", .5), "p50 "+p("standby", .5), "")
		row("", "p99 "+p("checkpoint", .99), "p99 "+p("bucket", .99), "p99 "+p("standby", .99), "")
		puts := func(name string) string {
			r := tp[key][name]
			put, _, _ := r.req.tiers()
			return fmt.Sprintf("%.1f (%d log)", float64(put)/r.took.Seconds(), r.req.count("PUT log"))
		}
		if r := tp[key]["standby"]; r.segs > 0 {
			row("  stream segments per write; time per segment", "", "", fmt.Sprintf("%.3f; %s", float64(r.segs)/float64(r.writes), ms(r.took/time.Duration(r.segs))), "")
		}
		row("  bucket PUTs per second of the space", puts("checkpoint"), puts("bucket"), puts("standby"), "")
		cpu := map[string][]string{}
		for _, name := range []string{"checkpoint", "bucket", "standby"} {
			cpu[name] = tp[key][name].cpu.perWrite(tp[key][name].writes)
		}
		for i, part := range append(cpuPartNames, "all") {
			what := ""
			if i == 0 {
				what = "  CPU per write, µs:"
			}
			row(fmt.Sprintf("%-22s %s", what, part), cpu["checkpoint"][i], cpu["bucket"][i], cpu["standby"][i], "")
		}
	}
	per := map[string]requests{}
	for _, s := range spaces {
		per[s.name] = since(before, after, s.host)
	}
	steadyPuts := func(name string) string {
		put, _, _ := per[name].tiers()
		return fmt.Sprintf("%.2f/s (%d log)", float64(put)/steadyTook.Seconds(), per[name].count("PUT log"))
	}
	row(fmt.Sprintf("bucket PUTs per second, %d writes/s each for %v", rate, steadyTook.Round(time.Second)), steadyPuts("checkpoint"), steadyPuts("bucket"), steadyPuts("standby"), "")
	for _, s := range spaces {
		logf("  %s space's requests in the steady phase: %s", s.name, opsString(per[s.name]))
	}
	logf("  the boxes' own requests (not a space's) in the steady phase: %s", opsString(since(before, after, "")))
	st := sby.log(t).Standby
	logf("  the standby space's stream: %+v", st)
	logf("load average at the end %s", loadavg())

	// What noise cannot change.
	for _, s := range spaces {
		if n := s.log(t).Failed; n > 0 {
			t.Errorf("the %s space's gate refused %d answers (503)", s.name, n)
		}
		if n := s.failed.Load(); n > 0 {
			t.Errorf("%s: %d of %d writes not answered 201 (last: %v)", s.name, n, s.n.Load(), s.lastErr.Load())
		}
	}
	if st == nil || st.Box != selfOf(other) || st.Streamed == 0 || st.Lost > 0 {
		t.Errorf("the standby space's stream: %+v, want segments streamed to %s and no standby lost", st, selfOf(other))
	}
	for _, s := range []*space{bkt, sby} {
		if per[s.name].count("PUT log")+tp["local"][s.name].req.count("PUT log") == 0 {
			t.Errorf("the %s space's writes landed no log segments in the bucket", s.name)
		}
	}
	if n := per["checkpoint"].count("PUT log"); n > 0 {
		t.Errorf("the checkpoint space wrote %d log segments", n)
	}
}

// streamed is the segments s's stream has sent to its standby since its wake (0 for a
// space of another durability).
func streamed(t *testing.T, s *space) uint64 {
	if st := s.log(t).Standby; st != nil {
		return st.Streamed
	}
	return 0
}

// added is a - b in milliseconds, signed.
func added(a, b time.Duration) string {
	return fmt.Sprintf("%+.1f ms", float64((a-b).Microseconds())/1000)
}

// rotate runs f on every space in rounds, round i starting at space i (mod len).
func rotate(rounds int, spaces []*space, f func(*space)) {
	for i := range rounds {
		for j := range spaces {
			f(spaces[(i+j)%len(spaces)])
		}
	}
}

// startMeshBox starts box i of a plain-HTTP mesh on 127.0.0.(i+1) (SELF
// http://127.0.0.(i+1):port), its bucket reached through link, with kinds.
func startMeshBox(t *testing.T, s3 *harness.S3, link *bucketLink, i int, kinds map[string]any) *harness.Box {
	t.Helper()
	ip := fmt.Sprintf("127.0.0.%d", i+1)
	addr := net.JoinHostPort(ip, harness.FreePort(t, ip))
	js := harness.Config{
		Listen:      addr,
		Lchat:       map[string]any{"mesh": map[string]any{"beat": "1s", "dead_after": "3s"}, "kinds": kinds},
		MeshAPIHost: ip,
	}.JSON()
	env := s3.Env("durbench-standby/")
	for j, kv := range env {
		if strings.HasPrefix(kv, "AWS_ENDPOINT_URL_S3=") {
			env[j] = "AWS_ENDPOINT_URL_S3=" + link.URL()
		}
	}
	env = append(env, mesh.EnvSelf+"=http://"+addr, mesh.EnvDomains+"=durbench.test", mesh.EnvToken+"=durbench-mesh-token-6c1e0a9b7d3f5e2a")
	b := harness.StartBox(t, harness.BoxOptions{JSON: js, Env: env, IP: ip})
	// The box listens on addr (its SELF, which had to be known before it started), not on
	// the port StartBox picked: Client and URL go there.
	b.HTTPAddr, b.HTTPURL = addr, "http://"+addr
	return b
}

func selfOf(b *harness.Box) string { return b.HTTPURL }

func jsonInto(data []byte, v any) bool { return json.Unmarshal(data, v) == nil }

// hostOwnedBy is a host of the mesh domain named after tag whose placement among members
// puts it on want.
func hostOwnedBy(t *testing.T, tag string, members []mesh.Member, want string) string {
	t.Helper()
	for i := range 10000 {
		h := fmt.Sprintf("%s%d.durbench.test", tag, i)
		if o, ok := mesh.Owner(h, members, ""); ok && o.Self == want {
			return h
		}
	}
	t.Fatalf("no host placed on %s", want)
	return ""
}
