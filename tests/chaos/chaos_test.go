// Package chaos is a seeded fault campaign: real lchat-caddy boxes on one versitygw, each
// box's bucket traffic through its own TCP proxy, clients writing uniquely numbered
// messages to demo spaces through random boxes while a nemesis, drawing from a seed,
// kills, stops, drains, cuts, partitions and slows boxes. A history of every request and of the
// boxes' checkpoints feeds a checker that asserts the contract stated in the README
// ("Under faults"). The short form runs in the normal test run; LCHAT_CHAOS_MINUTES=30
// runs the long form (5 boxes, 20 spaces); LCHAT_CHAOS_SEED=<n> replays a campaign;
// LCHAT_CHAOS_FAULTS=recreate,sigkill draws only those faults.
//
// The spaces rotate over three kinds: durability bucket and durability standby, on which
// no acknowledged write may be lost whatever the fault, and checkpoint, whose losses to
// hard faults are counted beside them (LCHAT_CHAOS_DURABILITY=bucket, standby or
// checkpoint runs every space at one durability).
package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

const instanceHeader = "X-Lchat-Instance"

// record is one request of the history.
type record struct {
	box        int    // the box the client sent it to
	space      string // host
	op         string // "write" or "read"
	status     int    // 0: no answer (connection error, timeout)
	retryAfter string
	instance   string // X-Lchat-Instance: "<self> <pid>@<wake ns>"
	msg        string // the write's unique text
	body       string // the start of a 5xx answer's body
	start, end time.Time
}

// fault is one action of the nemesis, from start until healed.
type fault struct {
	kind        string
	box         int
	start, heal time.Time
	// hard: the box's instances may have lost writes acknowledged since their last
	// checkpoint (SIGKILL, SIGSTOP past dead_after, bucket cut).
	hard bool
}

type history struct {
	mu      sync.Mutex
	reqs    []record
	faults  []fault
	syncs   map[string][]time.Time // "<box>|<host>" -> distinct last_sync values, ascending
	healthy atomic.Bool            // no fault in progress (for the 503-while-live count)
	// durability is, per host, every durability a box's status reported for it;
	// segments the most log segments one status showed for it (bucket durability).
	durability map[string]map[string]bool
	segments   map[string]uint64
	// streamed is, per host, the most segments one status said its standby took
	// (durability standby); noStandby every reason a status gave for it having none.
	streamed  map[string]uint64
	noStandby map[string]map[string]bool
	// takeovers are the boxes' takeovers of a space from a dead holder, by
	// "<box>|<host>|<at>" (their status lists the recent ones).
	takeovers map[string]takeover
	// verdicts is, per host, how many times a standby found its holder dead before its
	// heartbeat and started to take the space over (read from the boxes' logs at the end).
	verdicts map[string]int
	// fenced is, per box, when it fenced itself because its heartbeat writes failed
	// (read from its log at the end, selfFences).
	fenced map[int][]time.Time
}

// selfFenceMsg is what a box logs when it fences itself for failing heartbeat writes.
const selfFenceMsg = "fencing this box: heartbeat writes are failing"

// selfFences lists when a box's log (JSON lines) says it fenced itself for failing
// heartbeat writes.
func selfFences(logs string) []time.Time {
	var out []time.Time
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, selfFenceMsg) {
			continue
		}
		var e struct {
			TS  float64 `json:"ts"`
			Msg string  `json:"msg"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(l)), &e) == nil && strings.HasPrefix(e.Msg, selfFenceMsg) {
			sec, frac := math.Modf(e.TS)
			out = append(out, time.Unix(int64(sec), int64(frac*1e9)))
		}
	}
	return out
}

// holderGoneMsg is what a standby logs when it finds a holder dead before its heartbeat
// (its address refuses connections, or it restarted) and takes its spaces over.
const holderGoneMsg = "holder gone before its heartbeat"

// holderGone lists the spaces of every such verdict in a box's log (JSON lines), once per
// verdict.
func holderGone(logs string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, holderGoneMsg) {
			continue
		}
		var e struct {
			Msg   string   `json:"msg"`
			Hosts []string `json:"hosts"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(l)), &e) == nil && strings.HasPrefix(e.Msg, holderGoneMsg) {
			out = append(out, e.Hosts...)
		}
	}
	return out
}

// selfFenced is box b's first self-fence in [from, to], if any.
func (h *history) selfFenced(b int, from, to time.Time) (time.Time, bool) {
	for _, at := range h.fenced[b] {
		if !at.Before(from) && !at.After(to) {
			return at, true
		}
	}
	return time.Time{}, false
}

func (h *history) add(r record) {
	h.mu.Lock()
	h.reqs = append(h.reqs, r)
	h.mu.Unlock()
}

func (h *history) sync(box int, host string, at time.Time) {
	k := strconv.Itoa(box) + "|" + host
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.syncs[k]
	if len(s) == 0 || at.After(s[len(s)-1]) {
		h.syncs[k] = append(s, at)
	}
}

// durabilityOf is the durability of a campaign kind.
func durabilityOf(kind string) string {
	switch kind {
	case kindBucket:
		return "bucket"
	case kindStandby:
		return "standby"
	}
	return "checkpoint"
}

// lossless reports whether a durability forbids losing any acknowledged write.
func lossless(durability string) bool { return durability == "bucket" || durability == "standby" }

// spaceKinds is the kind of each of n spaces, by $LCHAT_CHAOS_DURABILITY: "mix" (the
// default) rotates them over bucket, standby and checkpoint (s0 bucket, s1 standby, s2
// checkpoint, s3 bucket, ...), reported side by side; "bucket", "standby" or
// "checkpoint" makes them all of one.
func spaceKinds(t *testing.T, n int) []string {
	mode := os.Getenv("LCHAT_CHAOS_DURABILITY")
	kinds := make([]string, n)
	for i := range kinds {
		switch mode {
		case "", "mix":
			kinds[i] = []string{kindBucket, kindStandby, kindCheckpoint}[i%3]
		case "bucket":
			kinds[i] = kindBucket
		case "standby":
			kinds[i] = kindStandby
		case "checkpoint":
			kinds[i] = kindCheckpoint
		default:
			t.Fatalf("LCHAT_CHAOS_DURABILITY=%q: want mix, bucket, standby or checkpoint", mode)
		}
	}
	return kinds
}

type params struct {
	boxes, spaces, clients int
	run                    time.Duration
	faults                 []string // the kinds of fault the nemesis draws from
}

// replayFaults are the faults a seed of testdata/seeds drew from when it failed: the
// replay keeps the list, so that the seed draws the same faults again.
var replayFaults = []string{"sigkill", "sigstop", "sigterm", "cut", "blackhole", "latency", "droplost", "reload", "recreate", "relocate", "repldelay"}

// allFaults are the campaign's faults: those, and a box the others cannot reach.
var allFaults = append(slices.Clip(replayFaults), "partition")

func campaignParams(t *testing.T) params {
	if m := os.Getenv("LCHAT_CHAOS_MINUTES"); m != "" {
		n, err := strconv.Atoi(m)
		if err != nil || n < 1 {
			t.Fatalf("LCHAT_CHAOS_MINUTES=%q: want a number of minutes", m)
		}
		return params{boxes: 5, spaces: 20, clients: 8, run: time.Duration(n) * time.Minute, faults: allFaults}
	}
	if testing.Short() {
		return params{boxes: 3, spaces: 4, clients: 3, run: 30 * time.Second, faults: allFaults}
	}
	return params{boxes: 3, spaces: 6, clients: 4, run: 70 * time.Second, faults: allFaults}
}

func TestChaosCampaign(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LCHAT_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LCHAT_CHAOS_SEED=%q: want a number", s)
		}
		seed = v
	}
	campaign(t, seed, campaignParams(t))
}

// TestChaosReplay runs, in the short form, every seed of testdata/seeds: seeds whose campaign
// once failed (a fix's regression test; the campaign's own draws, not the timing, repeat).
func TestChaosReplay(t *testing.T) {
	if os.Getenv("LCHAT_CHAOS_MINUTES") != "" || os.Getenv("LCHAT_CHAOS_SEED") != "" {
		t.Skip("a long or replayed campaign runs alone")
	}
	data, err := os.ReadFile("testdata/seeds")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		seed, err := strconv.ParseUint(line, 10, 64)
		if err != nil {
			t.Fatalf("testdata/seeds: %q is not a seed", line)
		}
		t.Run(line, func(t *testing.T) {
			campaign(t, seed, params{boxes: 3, spaces: 4, clients: 3, run: 30 * time.Second, faults: replayFaults})
		})
	}
}

// campaign runs one fault campaign drawn from seed and checks its contract.
func campaign(t *testing.T, seed uint64, p params) {
	fmt.Printf("chaos: seed %d (replay: LCHAT_CHAOS_SEED=%d), %d boxes, %d spaces, %d clients, %v of faults\n",
		seed, seed, p.boxes, p.spaces, p.clients, p.run)
	t.Logf("chaos seed %d (replay with LCHAT_CHAOS_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	c := newCluster(t, p.boxes)
	// Replication goes to the members a box sees live (a new box is seeded with
	// mesh-seed): create the spaces once every box sees every other.
	c.waitAllLive()
	var hosts []string
	spaceKind := map[string]string{}
	for i, kind := range spaceKinds(t, p.spaces) {
		h := fmt.Sprintf("s%d.%s", i, meshDomain)
		hosts = append(hosts, h)
		spaceKind[h] = kind
		fmt.Printf("chaos: %s durability %s (kind %s)\n", h, durabilityOf(kind), kind)
		c.nodes[i%len(c.nodes)].AdminJSON("POST", "/lchat/routes", map[string]any{"host": h, "kind": kind}, http.StatusCreated, nil)
	}
	harness.WaitFor(t, 30*time.Second, "every box to have every route", func() bool {
		for _, n := range c.nodes {
			rs, err := n.routes()
			if err != nil || len(rs) != len(hosts) {
				return false
			}
		}
		return true
	})

	h := &history{syncs: map[string][]time.Time{}, durability: map[string]map[string]bool{}, segments: map[string]uint64{},
		streamed: map[string]uint64{}, noStandby: map[string]map[string]bool{}, takeovers: map[string]takeover{}}
	h.healthy.Store(true)
	stop := make(chan struct{})
	var wg sync.WaitGroup

	// The status poller: every box's checkpoints (last_sync per space), the checker's
	// knowledge of which acknowledged writes a hard fault may take.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			for _, n := range c.nodes {
				n.mu.Lock()
				stopped := n.stopped
				n.mu.Unlock()
				if stopped || n.Exited() {
					continue
				}
				var st boxStatus
				if n.adminGet("/lchat/status", &st) != nil {
					continue
				}
				for _, s := range st.Spaces {
					if s.LastSync != nil {
						h.sync(n.i, s.Host, *s.LastSync)
					}
					h.reported(s.Host, s.Durability, s.Log)
				}
				if st.Mesh != nil && st.Mesh.StandbyTotals != nil {
					h.tookOver(n.i, st.Mesh.StandbyTotals.Recent)
				}
			}
		}
	}()

	// Clients: uniquely numbered writes and reads, each through a random box, leaving
	// alone the spaces the nemesis pauses (paused: host -> struct{}).
	var paused sync.Map
	var seq atomic.Int64
	for ci := range p.clients {
		wg.Add(1)
		crng := rand.New(rand.NewPCG(seed+uint64(ci)+1, 7))
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := c.nodes[crng.IntN(len(c.nodes))]
				host := hosts[crng.IntN(len(hosts))]
				if _, quiet := paused.Load(host); quiet {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				r := record{box: n.i, space: host, op: "read"}
				var req *http.Request
				if crng.IntN(10) < 7 {
					r.op = "write"
					r.msg = fmt.Sprintf("m%d", seq.Add(1))
					req, _ = http.NewRequest("POST", "https://"+host+"/api/messages",
						strings.NewReader(fmt.Sprintf(`{"author":"chaos","text":%q}`, r.msg)))
					req.Header.Set("Content-Type", "application/json")
				} else {
					req, _ = http.NewRequest("GET", "https://"+host+"/api/messages?limit=5", nil)
				}
				r.start = time.Now()
				resp, err := n.http.Do(req)
				if err == nil {
					data, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					r.status = resp.StatusCode
					if r.status >= 500 {
						r.body = string(data[:min(len(data), 200)])
					}
					r.retryAfter = resp.Header.Get("Retry-After")
					r.instance = resp.Header.Get(instanceHeader)
				}
				r.end = time.Now()
				h.add(r)
				if err != nil || r.status >= 500 {
					time.Sleep(100 * time.Millisecond)
				} else {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}

	// The nemesis: faults drawn from the seed, each healed before the next; one draw in
	// four runs two faults at once on two different boxes.
	kinds := p.faults
	if only := os.Getenv("LCHAT_CHAOS_FAULTS"); only != "" {
		// A subset, to focus a campaign: LCHAT_CHAOS_FAULTS=recreate,sigkill
		kinds = strings.Split(only, ",")
	}
	nem := &nemesis{t: t, c: c, h: h, hosts: hosts, kinds: spaceKind, paused: &paused, counts: map[string]int{}, outcomes: map[string]int{}}
	deadline := time.Now().Add(p.run)
	time.Sleep(3 * time.Second) // some writes before the first fault
	for time.Now().Before(deadline) {
		h.healthy.Store(false)
		first := c.nodes[rng.IntN(len(c.nodes))]
		if rng.IntN(4) == 0 && len(c.nodes) > 1 {
			second := c.nodes[(first.i+1+rng.IntN(len(c.nodes)-1))%len(c.nodes)]
			k1, k2 := kinds[rng.IntN(len(kinds))], kinds[rng.IntN(len(kinds))]
			r1 := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			r2 := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			var fw sync.WaitGroup
			fw.Add(2)
			go func() { defer fw.Done(); nem.run(k1, first, r1, true) }()
			time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
			go func() { defer fw.Done(); nem.run(k2, second, r2, true) }()
			fw.Wait()
			nem.count("two faults at once")
		} else {
			nem.run(kinds[rng.IntN(len(kinds))], first, rng, false)
		}
		h.healthy.Store(true)
		time.Sleep(time.Duration(1+rng.IntN(3)) * time.Second)
	}
	counts, outcomes := nem.counts, nem.outcomes
	// Overlapping faults may heal out of order: the last heal is the latest.
	lastHeal := time.Now()
	if len(h.faults) > 0 {
		lastHeal = h.faults[0].heal
		for _, f := range h.faults {
			if f.heal.After(lastHeal) {
				lastHeal = f.heal
			}
		}
	}

	// (4) After the last fault heals, every space answers within dead_after + 5 s.
	recovery := map[string]time.Duration{}
	for _, host := range hosts {
		var ok bool
		for try := 0; !ok && (try == 0 || time.Since(lastHeal) < deadAfter+5*time.Second); try++ {
			for _, n := range c.nodes {
				req, _ := http.NewRequest("GET", "https://"+host+"/api/messages?limit=1", nil)
				if resp, err := n.http.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok = ok || resp.StatusCode == 200
				}
			}
			if !ok {
				time.Sleep(100 * time.Millisecond)
			}
		}
		recovery[host] = time.Since(lastHeal)
		if !ok {
			t.Errorf("%s: not answering %v after the last fault healed (bound: dead_after %v + 5s)", host, time.Since(lastHeal).Round(time.Millisecond), deadAfter)
		}
	}
	close(stop)
	wg.Wait()

	// ... and every box's registry agrees.
	var tables []map[string]string
	agree := func() bool {
		tables = tables[:0]
		for _, n := range c.nodes {
			rs, err := n.routes()
			if err != nil {
				return false
			}
			tables = append(tables, rs)
		}
		for _, rs := range tables {
			if fmt.Sprint(rs) != fmt.Sprint(tables[0]) || len(rs) != len(hosts) {
				return false
			}
		}
		return true
	}
	for start := time.Now(); !agree(); time.Sleep(200 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			for i, rs := range tables {
				t.Errorf("registries disagree 10s after the campaign: box %d has %v", i, rs)
			}
			break
		}
	}

	// Read back every space, through box 0 (which forwards to the holder).
	stored := map[string]map[string]bool{}
	for _, host := range hosts {
		var err error
		if stored[host], err = readAll(c.nodes[0], host); err != nil {
			t.Errorf("reading back %s: %v", host, err)
		}
	}
	h.fenced = map[int][]time.Time{}
	h.verdicts = map[string]int{}
	for _, n := range c.nodes {
		logs := n.Logs()
		h.fenced[n.i] = selfFences(logs)
		for _, host := range holderGone(logs) {
			h.verdicts[host]++
		}
	}
	rep := check(h, stored, hosts, spaceKind)
	rep.counts, rep.outcomes = counts, outcomes
	rep.print(os.Stdout)
	for _, e := range rep.errors {
		t.Error(e)
	}
	// Each kind was what its spaces ran: each status said so; a bucket space's showed
	// its log, a standby space's its stream to its standby (or why it had none).
	for _, host := range hosts {
		want := durabilityOf(spaceKind[host])
		for d := range h.durability[host] {
			if d != want {
				t.Errorf("%s (kind %s) reported durability %q, want %q", host, spaceKind[host], d, want)
			}
		}
		if !h.durability[host][want] {
			t.Errorf("%s (kind %s): no status reported its durability", host, spaceKind[host])
		}
		if want == "bucket" && h.segments[host] == 0 {
			t.Errorf("%s (durability bucket): no status showed a segment of its log", host)
		}
		if want == "standby" {
			var whys []string
			for w := range h.noStandby[host] {
				whys = append(whys, w)
			}
			sort.Strings(whys)
			switch {
			case h.streamed[host] > 0:
				fmt.Printf("chaos: %s (standby) streamed up to %d segments to its standby in one wake\n", host, h.streamed[host])
			case len(whys) > 0:
				// No stream in any status: the space never had a standby; say why.
				fmt.Printf("chaos: %s (standby) never streamed: %s\n", host, strings.Join(whys, "; "))
			default:
				t.Errorf("%s (durability standby): no status showed a segment streamed to a standby, nor why it had none", host)
			}
		}
	}
	// A write a bucket or standby kind lost: what the boxes logged of its space around it.
	for _, r := range first(rep.durableLost, 3) {
		for _, n := range c.nodes {
			if lines := logsAround(n.Logs(), r.space, r.start.Add(-5*time.Second), r.end.Add(15*time.Second), 60); lines != "" {
				t.Logf("box %d's log of %s around %s (acknowledged %s):\n%s", n.i, r.space, r.msg, r.end.Format("15:04:05.000"), lines)
			}
		}
	}
	if t.Failed() {
		t.Logf("replay with LCHAT_CHAOS_SEED=%d", seed)
	}
}

// readAll returns the texts of every message of host, paging through /api/messages.
func readAll(n *node, host string) (map[string]bool, error) {
	out := map[string]bool{}
	after := int64(0)
	for {
		var msgs []struct {
			ID   int64  `json:"id"`
			Text string `json:"text"`
		}
		var err error
		for range 20 {
			req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s/api/messages?after=%d&limit=1000", host, after), nil)
			var resp *http.Response
			if resp, err = n.http.Do(req); err == nil {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					err = json.Unmarshal(data, &msgs)
					if err == nil {
						break
					}
				} else {
					err = fmt.Errorf("%d %s", resp.StatusCode, data)
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			return out, err
		}
		for _, m := range msgs {
			out[m.Text] = true
			after = max(after, m.ID)
		}
		if len(msgs) < 1000 {
			return out, nil
		}
	}
}

// report is what the checker found.
type report struct {
	counts, outcomes       map[string]int
	requests, acked        int
	allowedLoss, forbidden int
	byCode                 map[int]int
	noAnswer               int
	live503                int
	overlaps               int
	afterTakeover          int // writes acknowledged by an instance after a newer one woke
	longest                map[string]time.Duration
	errors                 []string
	faults                 []fault
	allowedBy              map[string]int // allowed losses by the fault that excuses them
	// ackedInto is, per fault kind, the latest acknowledgment of an allowed loss after
	// its fault began: how long a faulty box went on acknowledging writes it then lost.
	ackedInto               map[string]time.Duration
	allowedList, forbiddenL []string
	// byDurability is the figures of the spaces of each durability ("bucket",
	// "checkpoint"), side by side.
	byDurability map[string]*tally
	// durableLost are the writes a bucket or standby kind acknowledged and lost: each one
	// forbidden.
	durableLost []record
	// failedTakeovers are the failed takeovers the boxes' statuses listed, with their error.
	failedTakeovers []string
}

// tally is the figures of the spaces of one durability.
type tally struct {
	spaces, acked, allowed, forbidden, unavailable int // unavailable: 503s
	allowedBy                                      map[string]int
	// verdicts: its spaces' holders found dead by their standby before their heartbeat
	// (the boxes' logs); takeovers: the takeovers that followed, as the boxes' statuses
	// listed them, and the failed ones (a box killed right after its takeover, before a
	// poll, is missing from these two).
	verdicts, takeovers, takeoverFailures int
}

func (rep *report) tally(durability string) *tally {
	tl := rep.byDurability[durability]
	if tl == nil {
		tl = &tally{allowedBy: map[string]int{}}
		rep.byDurability[durability] = tl
	}
	return tl
}

// durabilities are the durabilities the campaign runs, in the order it reports them.
var durabilities = []string{"bucket", "standby", "checkpoint"}

// check asserts the contract on the history; stored is every space's messages at the end,
// kinds every space's kind.
func check(h *history, stored map[string]map[string]bool, hosts []string, kinds map[string]string) *report {
	h.mu.Lock()
	defer h.mu.Unlock()
	rep := &report{byCode: map[int]int{}, longest: map[string]time.Duration{}, faults: h.faults, allowedBy: map[string]int{}, ackedInto: map[string]time.Duration{},
		byDurability: map[string]*tally{}}
	for _, host := range hosts {
		rep.tally(durabilityOf(kinds[host])).spaces++
	}
	for host, n := range h.verdicts {
		rep.tally(durabilityOf(kinds[host])).verdicts += n
	}
	for _, tk := range h.takeovers {
		tl := rep.tally(durabilityOf(kinds[tk.Host]))
		if tk.Err == "" {
			tl.takeovers++
		} else {
			tl.takeoverFailures++
			rep.failedTakeovers = append(rep.failedTakeovers, fmt.Sprintf("%s from %s (%s) at %s: %s",
				tk.Host, tk.Holder, tk.Why, tk.At.Format("15:04:05.000"), tk.Err))
		}
	}
	boxOf := func(r record) int {
		// The instance header names the box that served the request (a forwarded
		// request is served by the holder); the entry box otherwise.
		if self, _, ok := strings.Cut(r.instance, " "); ok {
			for i := range 16 {
				if strings.Contains(self, fmt.Sprintf("//127.0.0.%d:", i+1)) {
					return i
				}
			}
		}
		return r.box
	}
	type life struct{ firstEnd, lastStart time.Time }
	lives := map[string]map[string]*life{} // space -> instance -> certain lifetime
	for _, r := range h.reqs {
		rep.requests++
		dur := durabilityOf(kinds[r.space])
		tl := rep.tally(dur)
		if r.status == 0 {
			rep.noAnswer++
			continue
		}
		rep.byCode[r.status]++
		// (2) never a 502; every 503 has Retry-After.
		if r.status == http.StatusBadGateway {
			rep.errors = append(rep.errors, fmt.Sprintf("502 for %s %s via box %d at %s..%s (body %q)", r.op, r.space, r.box, r.start.Format("15:04:05.000"), r.end.Format("15:04:05.000"), r.body))
		}
		if r.status == http.StatusServiceUnavailable {
			tl.unavailable++
			if r.retryAfter == "" {
				rep.errors = append(rep.errors, fmt.Sprintf("503 without Retry-After for %s %s via box %d at %s", r.op, r.space, r.box, r.start.Format("15:04:05.000")))
			}
			if calm(h.faults, r.start, r.end) {
				rep.live503++
			}
		}
		if r.status < 300 && r.instance != "" {
			if lives[r.space] == nil {
				lives[r.space] = map[string]*life{}
			}
			l := lives[r.space][r.instance]
			if l == nil {
				l = &life{firstEnd: r.end, lastStart: r.start}
				lives[r.space][r.instance] = l
			}
			if r.end.Before(l.firstEnd) {
				l.firstEnd = r.end
			}
			if r.start.After(l.lastStart) {
				l.lastStart = r.start
			}
		}
		if r.op != "write" || r.status != http.StatusCreated {
			continue
		}
		// (1) no acknowledged write lost: on a bucket or standby kind whatever the
		// fault; on a checkpoint kind except after a hard fault of the box whose instance
		// acknowledged it, with no checkpoint of that space since.
		rep.acked++
		tl.acked++
		if stored[r.space][r.msg] {
			continue
		}
		b := boxOf(r)
		if f, ok := hardFaultUncheckpointed(h, b, r); ok && dur == "checkpoint" {
			rep.allowedLoss++
			tl.allowed++
			tl.allowedBy[f.kind]++
			rep.allowedBy[f.kind]++
			rep.ackedInto[f.kind] = max(rep.ackedInto[f.kind], r.end.Sub(f.start))
			rep.allowedList = append(rep.allowedList, fmt.Sprintf("%s %s acknowledged by box %d at %s", r.space, r.msg, b, r.end.Format("15:04:05.000")))
			continue
		}
		rep.forbidden++
		tl.forbidden++
		after := "no fault of its box ended the instance"
		if f, ok := endingFault(h, b, r); ok {
			after = fmt.Sprintf("then %s of box %d %s..%s", f.kind, f.box, f.start.Format("15:04:05.000"), f.heal.Format("15:04:05.000"))
		}
		if lossless(dur) {
			rep.durableLost = append(rep.durableLost, r)
		}
		rep.forbiddenL = append(rep.forbiddenL, fmt.Sprintf("%s (durability %s) %s acknowledged by box %d (%s) at %s..%s, %s; its checkpoints of the space near then: %s",
			r.space, dur, r.msg, b, r.instance, r.start.Format("15:04:05.000"), r.end.Format("15:04:05.000"), after, syncsAround(h, b, r.space, r.end)))
	}
	for _, d := range []string{"bucket", "standby"} {
		if n := rep.tally(d).forbidden; n > 0 {
			rep.errors = append(rep.errors, fmt.Sprintf("%d writes acknowledged by a %s kind lost (no fault excuses one)", n, d))
		}
	}
	if n := rep.tally("checkpoint").forbidden; n > 0 {
		rep.errors = append(rep.errors, fmt.Sprintf("%d writes acknowledged by a checkpoint kind lost without a hard fault to excuse them", n))
	}
	if rep.forbidden > 0 {
		rep.errors = append(rep.errors, "forbidden losses: "+strings.Join(first(rep.forbiddenL, 20), "; "))
	}
	// (2) no write is acknowledged by an instance after another instance of the space
	// took it over: a write acknowledged by instance A must have been sent before every
	// instance that woke after A (instances name their wake time; one machine, one clock).
	wakes := map[string][]time.Time{} // space -> wake times of the instances that answered
	for _, r := range h.reqs {
		if at, ok := instanceWake(r.instance); ok && r.status > 0 && r.status < 300 && !slices.ContainsFunc(wakes[r.space], at.Equal) {
			wakes[r.space] = append(wakes[r.space], at)
		}
	}
	for _, r := range h.reqs {
		at, ok := instanceWake(r.instance)
		if r.op != "write" || r.status != http.StatusCreated || !ok {
			continue
		}
		for _, w := range wakes[r.space] {
			if w.After(at) && r.start.After(w) {
				rep.afterTakeover++
				rep.errors = append(rep.errors, fmt.Sprintf("%s %s acknowledged by %q (sent %s) after a newer instance woke at %s",
					r.space, r.msg, r.instance, r.start.Format("15:04:05.000"), w.Format("15:04:05.000")))
				break
			}
		}
	}
	// (3) at most one instance of a space answers at a moment: the certain lifetimes
	// (from the end of its first answer to the start of its last) of two instances never
	// overlap.
	for space, ls := range lives {
		var names []string
		for k := range ls {
			names = append(names, k)
		}
		sort.Strings(names)
		for i, a := range names {
			for _, b := range names[i+1:] {
				la, lb := ls[a], ls[b]
				if la.firstEnd.Before(lb.lastStart) && lb.firstEnd.Before(la.lastStart) {
					rep.overlaps++
					rep.errors = append(rep.errors, fmt.Sprintf("%s: instances %q (%s..%s) and %q (%s..%s) answered at the same time", space,
						a, la.firstEnd.Format("15:04:05.000"), la.lastStart.Format("15:04:05.000"),
						b, lb.firstEnd.Format("15:04:05.000"), lb.lastStart.Format("15:04:05.000")))
				}
			}
		}
	}
	// Longest unavailability per space: the longest time between two successful answers.
	for _, host := range hosts {
		var ends []time.Time
		for _, r := range h.reqs {
			if r.space == host && r.status > 0 && r.status < 300 {
				ends = append(ends, r.end)
			}
		}
		slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
		for i := 1; i < len(ends); i++ {
			rep.longest[host] = max(rep.longest[host], ends[i].Sub(ends[i-1]))
		}
	}
	return rep
}

// instanceWake is the wake time named by an X-Lchat-Instance value ("<self> <pid>@<ns>").
func instanceWake(instance string) (time.Time, bool) {
	_, ns, ok := strings.Cut(instance, "@")
	if !ok {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}

// calm reports whether no fault was in progress (or healed under dead_after + 2 s ago)
// anywhere between start and end: a 503 then is for a space whose holder is live.
func calm(faults []fault, start, end time.Time) bool {
	for _, f := range faults {
		if f.start.Before(end) && f.heal.Add(deadAfter+2*time.Second).After(start) {
			return false
		}
	}
	return true
}

// hardFaultUncheckpointed reports whether the instance on box b that acknowledged the
// write ended in a hard fault (the first fault of b that ends instances, after the write
// started, is a hard one) with no checkpoint of the space by b known to have started
// after the acknowledgment and finished before the fault. A sync's last_sync is when it
// ended; the first one to end after the acknowledgment may have taken its snapshot
// before it, so a covering checkpoint is the second distinct last_sync after it.
//
// A box that fenced itself because its heartbeat writes failed, after the write and before
// its instance ended, was cut from the bucket whatever cut it (the shared S3 server
// stalled on a loaded machine): that is a hard fault too, "selffence", though the campaign
// did not throw it.
func hardFaultUncheckpointed(h *history, b int, r record) (fault, bool) {
	f, ok := endingFault(h, b, r)
	end := f.heal
	if !ok {
		end = r.end.Add(24 * time.Hour)
	}
	if !ok || !f.hard {
		at, fenced := h.selfFenced(b, r.end, end)
		if !fenced {
			return fault{}, false
		}
		f = fault{kind: "selffence", box: b, start: at, heal: at, hard: true}
	}
	n := 0
	for _, s := range h.syncs[strconv.Itoa(b)+"|"+r.space] {
		if s.After(r.end) && s.Before(f.start) {
			n++
		}
	}
	return f, n < 2
}

// endingFault is the first fault of box b that ends instances and had not healed when
// the write r started: the end of the instance on b that acknowledged r, if a fault
// ended it.
func endingFault(h *history, b int, r record) (fault, bool) {
	for _, f := range h.faults {
		if f.box == b && !f.heal.Before(r.start) && endsInstances[f.kind] {
			return f, true
		}
	}
	return fault{}, false
}

// endsInstances are the faults after which a box's instances are gone (or fenced).
var endsInstances = map[string]bool{"sigkill": true, "sigstop": true, "sigterm": true, "cut": true, "blackhole": true}

// syncsAround lists b's checkpoints of space within 3 s of t, for a loss report.
func syncsAround(h *history, b int, space string, t time.Time) string {
	var out []string
	for _, s := range h.syncs[strconv.Itoa(b)+"|"+space] {
		if s.After(t.Add(-3*time.Second)) && s.Before(t.Add(3*time.Second)) {
			out = append(out, s.Format("15:04:05.000"))
		}
	}
	return strings.Join(out, ",")
}

func first[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (rep *report) print(w io.Writer) {
	fmt.Fprintln(w, "chaos summary")
	var kinds []string
	total := 0
	for k, v := range rep.counts {
		kinds = append(kinds, k)
		total += v
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "  %-34s %d\n", "faults", total)
	for _, k := range kinds {
		fmt.Fprintf(w, "    %-32s %d\n", k, rep.counts[k])
	}
	if rep.allowedBy["selffence"] > 0 {
		kinds = append(kinds, "selffence") // not thrown: a box fenced itself (hardFaultUncheckpointed)
	}
	var outs []string
	for k := range rep.outcomes {
		outs = append(outs, k)
	}
	sort.Strings(outs)
	for _, k := range outs {
		fmt.Fprintf(w, "  %-34s %d\n", k, rep.outcomes[k])
	}
	fmt.Fprintf(w, "  %-34s %d\n", "requests", rep.requests)
	fmt.Fprintf(w, "  %-34s %d\n", "acknowledged writes", rep.acked)
	fmt.Fprintf(w, "  %-34s %d\n", "allowed losses (hard fault)", rep.allowedLoss)
	for _, k := range kinds {
		if rep.allowedBy[k] > 0 {
			fmt.Fprintf(w, "    %-32s %d (acknowledged up to %v into the fault)\n", "after "+k, rep.allowedBy[k], rep.ackedInto[k].Round(10*time.Millisecond))
		}
	}
	fmt.Fprintf(w, "  %-34s %d\n", "forbidden losses", rep.forbidden)
	rep.printByDurability(w, kinds)
	fmt.Fprintf(w, "  %-34s %d\n", "no answer (conn error/timeout)", rep.noAnswer)
	var codes []int
	for c := range rep.byCode {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		if c >= 500 {
			fmt.Fprintf(w, "  %-34s %d\n", fmt.Sprintf("%d responses", c), rep.byCode[c])
		}
	}
	fmt.Fprintf(w, "  %-34s %d\n", "503 with no fault near (holder live)", rep.live503)
	fmt.Fprintf(w, "  %-34s %d\n", "overlapping instances", rep.overlaps)
	fmt.Fprintf(w, "  %-34s %d\n", "acknowledged after a takeover", rep.afterTakeover)
	var hosts []string
	for h := range rep.longest {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	fmt.Fprintln(w, "  longest unavailability per space:")
	for _, h := range hosts {
		fmt.Fprintf(w, "    %-32s %v\n", h, rep.longest[h].Round(10*time.Millisecond))
	}
	for _, f := range rep.faults {
		fmt.Fprintf(w, "  fault %-9s box %d  %s .. %s\n", f.kind, f.box, f.start.Format("15:04:05.000"), f.heal.Format("15:04:05.000"))
	}
	for _, a := range first(rep.allowedList, 10) {
		fmt.Fprintf(w, "  allowed loss: %s\n", a)
	}
	for _, f := range first(rep.forbiddenL, 20) {
		fmt.Fprintf(w, "  forbidden loss: %s\n", f)
	}
	sort.Strings(rep.failedTakeovers)
	for _, f := range first(rep.failedTakeovers, 10) {
		fmt.Fprintf(w, "  takeover failed: %s\n", f)
	}
}

// printByDurability prints the figures of the bucket and checkpoint spaces side by side;
// faultKinds are the kinds of fault thrown, for the allowed losses each excused.
func (rep *report) printByDurability(w io.Writer, faultKinds []string) {
	cols := func(what string, v func(*tally) string) {
		fmt.Fprintf(w, "    %-32s", what)
		for _, d := range durabilities {
			fmt.Fprintf(w, " %12s", v(rep.tally(d)))
		}
		fmt.Fprintln(w)
	}
	num := func(f func(*tally) int) func(*tally) string {
		return func(tl *tally) string { return strconv.Itoa(f(tl)) }
	}
	fmt.Fprintf(w, "  %-34s", "by durability")
	for _, d := range durabilities {
		fmt.Fprintf(w, " %12s", d)
	}
	fmt.Fprintln(w)
	cols("spaces", num(func(tl *tally) int { return tl.spaces }))
	cols("acknowledged writes", num(func(tl *tally) int { return tl.acked }))
	// A bucket or standby kind allows no loss: its column says so rather than 0.
	allowed := func(f func(*tally) int) func(*tally) string {
		return func(tl *tally) string {
			if tl == rep.byDurability["bucket"] || tl == rep.byDurability["standby"] {
				return "none allowed"
			}
			return strconv.Itoa(f(tl))
		}
	}
	cols("allowed losses (hard fault)", allowed(func(tl *tally) int { return tl.allowed }))
	for _, k := range faultKinds {
		if rep.allowedBy[k] > 0 {
			cols("  after "+k, allowed(func(tl *tally) int { return tl.allowedBy[k] }))
		}
	}
	cols("forbidden losses", num(func(tl *tally) int { return tl.forbidden }))
	cols("503 responses", num(func(tl *tally) int { return tl.unavailable }))
	cols("holder found dead by standby", num(func(tl *tally) int { return tl.verdicts }))
	cols("  takeovers (statuses)", num(func(tl *tally) int { return tl.takeovers }))
	cols("  failed (statuses)", num(func(tl *tally) int { return tl.takeoverFailures }))
}

// reported notes what a box's status said of host: its durability and its log.
func (h *history) reported(host, durability string, log *logStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if durability != "" {
		if h.durability[host] == nil {
			h.durability[host] = map[string]bool{}
		}
		h.durability[host][durability] = true
	}
	if log != nil {
		h.segments[host] = max(h.segments[host], log.Segments)
	}
	if sb := log.standby(); sb != nil {
		h.streamed[host] = max(h.streamed[host], sb.Streamed)
		if sb.Box == "" && sb.NoStandby != "" {
			if h.noStandby[host] == nil {
				h.noStandby[host] = map[string]bool{}
			}
			h.noStandby[host][sb.NoStandby] = true
		}
	}
}

// tookOver notes the recent takeovers box b's status listed.
func (h *history) tookOver(b int, recent []takeover) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, tk := range recent {
		h.takeovers[fmt.Sprintf("%d|%s|%s", b, tk.Host, tk.At.Format(time.RFC3339Nano))] = tk
	}
}

// logsAround is the lines of a box's log that name host, logged between from and to (at
// most limit of them, the first ones).
func logsAround(logs, host string, from, to time.Time, limit int) string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, host) {
			continue
		}
		var e struct {
			TS float64 `json:"ts"`
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		at := time.Unix(0, int64(e.TS*1e9))
		if at.Before(from) || at.After(to) {
			continue
		}
		if out = append(out, line); len(out) == limit {
			break
		}
	}
	return strings.Join(out, "\n")
}

// TestCheckVerdictByDurability pins the checker's verdict on a lost write: a bucket or
// standby kind may lose none, whatever the fault; a checkpoint kind may lose one its box's hard fault
// took before a checkpoint covered it, and nothing else.
func TestCheckVerdictByDurability(t *testing.T) {
	t0 := time.Now()
	const bucketHost, standbyHost, checkpointHost = "b.chaos.test", "s.chaos.test", "c.chaos.test"
	kinds := map[string]string{bucketHost: kindBucket, standbyHost: kindStandby, checkpointHost: kindCheckpoint}
	write := func(host string) record {
		return record{box: 1, space: host, op: "write", status: http.StatusCreated, instance: "https://127.0.0.1:9 7@1",
			msg: "m-" + host, start: t0, end: t0.Add(10 * time.Millisecond)}
	}
	for _, tc := range []struct {
		name      string
		host      string
		fault     fault // on box 0, the instance's box
		stored    bool
		forbidden int
		allowed   int
	}{
		{"bucket kept", bucketHost, fault{kind: "sigkill", hard: true}, true, 0, 0},
		{"bucket lost to sigkill", bucketHost, fault{kind: "sigkill", hard: true}, false, 1, 0},
		{"bucket lost to cut", bucketHost, fault{kind: "cut", hard: true}, false, 1, 0},
		{"bucket lost to drain", bucketHost, fault{kind: "sigterm"}, false, 1, 0},
		{"checkpoint lost to sigkill", checkpointHost, fault{kind: "sigkill", hard: true}, false, 0, 1},
		{"checkpoint lost to drain", checkpointHost, fault{kind: "sigterm"}, false, 1, 0},
		{"checkpoint lost to a drain its box fenced", checkpointHost, fault{kind: "sigterm"}, false, 0, 1},
		{"bucket lost to a drain its box fenced", bucketHost, fault{kind: "sigterm"}, false, 1, 0},
		{"standby kept", standbyHost, fault{kind: "sigkill", hard: true}, true, 0, 0},
		{"standby lost to sigkill", standbyHost, fault{kind: "sigkill", hard: true}, false, 1, 0},
		{"standby lost to sigstop", standbyHost, fault{kind: "sigstop", hard: true}, false, 1, 0},
		{"standby lost to blackhole", standbyHost, fault{kind: "blackhole", hard: true}, false, 1, 0},
		{"standby lost to drain", standbyHost, fault{kind: "sigterm"}, false, 1, 0},
		{"standby lost to a drain its box fenced", standbyHost, fault{kind: "sigterm"}, false, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fault
			f.start, f.heal = t0.Add(time.Second), t0.Add(5*time.Second)
			h := &history{syncs: map[string][]time.Time{}, reqs: []record{write(tc.host)}, faults: []fault{f}}
			if strings.Contains(tc.name, "fenced") {
				// As its log says it: "fencing this box: heartbeat writes are failing".
				at := t0.Add(2 * time.Second)
				line := fmt.Sprintf(`{"level":"warn","ts":%.6f,"logger":"lchat.mesh.membership","msg":%q}`, float64(at.UnixNano())/1e9, selfFenceMsg)
				h.fenced = map[int][]time.Time{0: selfFences("other\n" + line + "\n")} // box 0, the instance's
				if len(h.fenced[0]) != 1 {
					t.Fatalf("no self-fence read from %s", line)
				}
			}
			stored := map[string]map[string]bool{tc.host: {"m-" + tc.host: tc.stored}}
			rep := check(h, stored, []string{bucketHost, standbyHost, checkpointHost}, kinds)
			if rep.forbidden != tc.forbidden || rep.allowedLoss != tc.allowed || (len(rep.errors) > 0) != (tc.forbidden > 0) {
				t.Errorf("forbidden %d, allowed %d, errors %q; want forbidden %d, allowed %d", rep.forbidden, rep.allowedLoss, rep.errors, tc.forbidden, tc.allowed)
			}
			if got := len(rep.durableLost); (kinds[tc.host] != kindCheckpoint && !tc.stored) != (got == 1) {
				t.Errorf("%d bucket or standby losses listed", got)
			}
		})
	}
}
