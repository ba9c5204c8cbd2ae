// Package lb runs boxes behind a real network load balancer: Debian's HAProxy in TCP mode,
// checking each box's health (lchat_health) and sending the PROXY protocol v2, on loopback
// addresses. The test plays the autoscaling group: it starts boxes and registers them
// through HAProxy's runtime API, and terminates them (SIGTERM, the drain) and deregisters
// them, while clients write to spaces and hold WebSockets through the balancer.
package lb

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	domain = "lb.test"
	token  = "test-mesh-token-lb-7c1e4a9f2b6d8e0a3c5f"
	// lbIP is where clients reach the balancer; lbSource the address it connects to the
	// boxes from, the one the boxes take a PROXY header from.
	lbIP     = "127.0.0.99"
	lbSource = "127.0.0.100"
	// writerIP and holderIP are the clients' own addresses, which the boxes must log.
	writerIP = "127.0.0.50"
	holderIP = "127.0.0.51"
	beat     = time.Second
	dead     = 3 * time.Second
	// shutdownDelay is how long a stopping box keeps its listeners open, its health check
	// failing: HAProxy counts it down after two failed checks 200 ms apart, well within
	// even on a loaded machine.
	shutdownDelay = 5 * time.Second
)

// fleet is the autoscaling group: the bucket, the balancer and the boxes.
type fleet struct {
	t      *testing.T
	s3     *harness.S3
	prefix string
	budget int64 // each box's memory_budget
	lb     *harness.HAProxy
	boxes  []*lbBox // the boxes running, in the order they started
	all    []*lbBox // every box started
	// fullest is each box's largest warm set over its budget that checkBudgets read.
	fullest map[string]float64
}

type lbBox struct {
	*harness.Box
	name, ip, addr, health, self string
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{t: t, s3: harness.StartS3(t), prefix: fmt.Sprintf("lb%d", time.Now().UnixNano()%1e9),
		fullest: map[string]float64{}}
	f.lb = harness.StartHAProxy(t, harness.HAProxyOptions{IP: lbIP, Source: lbSource, CheckPath: "/"})
	return f
}

// config is a box's JSON config: the mesh on the shared bucket, the demo room with
// durability bucket and its WebSockets held by the box, the PROXY protocol from the
// balancer on the main listener and the health listener, access logs, and the shutdown
// delay and grace period of the shipped mesh.Caddyfile.
func (f *fleet) config(b *lbBox) string {
	pp := []any{map[string]any{"wrapper": "lchat_proxy_protocol", "allow": []string{lbSource}}}
	js := harness.Config{
		Listen: b.addr,
		Lchat: map[string]any{
			"wake_scan_interval": "1s",
			// The budget is small, so that the few spaces the test wakes move the fleet's
			// signal; placement is the default, bounded loads.
			"mesh": map[string]any{"beat": beat.String(), "dead_after": dead.String(),
				"memory_budget": f.budget},
			"kinds": map[string]any{"demo": harness.DemoKind(map[string]any{
				"idle_timeout": "10m", "durability": "bucket",
				"env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"},
			})},
		},
		MeshAPIHost: b.ip,
		Main:        map[string]any{"listener_wrappers": pp, "logs": map[string]any{}},
		Servers: map[string]any{"health": map[string]any{
			"listen": []string{b.health}, "listener_wrappers": pp,
			"routes": []any{map[string]any{"handle": []any{map[string]any{"handler": "lchat_health"}}}},
		}},
	}.JSON()
	var cfg map[string]any
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		f.t.Fatal(err)
	}
	h := cfg["apps"].(map[string]any)["http"].(map[string]any)
	h["shutdown_delay"] = shutdownDelay.String()
	h["grace_period"] = "10s"
	out, _ := json.Marshal(cfg)
	return string(out)
}

// launch starts box number i and registers it with the balancer, as a launch hook
// does; it returns once the balancer counts it up, and how long that took from the
// start.
func (f *fleet) launch() (*lbBox, time.Duration) {
	t := f.t
	start := time.Now()
	b := f.startBox(len(f.all), f.prefix)
	_, port, _ := net.SplitHostPort(b.health)
	f.lb.AddServer(b.name, b.addr, port)
	harness.WaitFor(t, 30*time.Second, b.name+" up in the balancer", func() bool { return f.lb.State(b.name) == "UP" })
	f.boxes = append(f.boxes, b)
	f.all = append(f.all, b)
	return b, time.Since(start)
}

// startBox starts box number i of the mesh on the bucket's prefix.
func (f *fleet) startBox(i int, prefix string) *lbBox {
	t := f.t
	ip := fmt.Sprintf("127.0.0.%d", 10+i)
	b := &lbBox{name: fmt.Sprintf("box%d", i), ip: ip}
	b.addr = harness.FreeAddr(t, ip)
	b.health = harness.FreeAddr(t, ip)
	b.self = "http://" + b.addr
	env := append(f.s3.Env(prefix), mesh.EnvSelf+"="+b.self, mesh.EnvDomains+"="+domain, mesh.EnvToken+"="+token)
	b.Box = harness.StartBox(t, harness.BoxOptions{JSON: f.config(b), Env: env, IP: ip})
	return b
}

// spaceSize is the warm set of one awake space of the test's kind on this machine (the demo
// room's resident memory differs with how it was built), measured on a box of its own
// (another prefix of the bucket: no member of the fleet), so that the fleet's budget can be
// a number of spaces.
func (f *fleet) spaceSize() int64 {
	t := f.t
	f.budget = 1 << 40
	b := f.startBox(99, f.prefix+"-size")
	// It stops (its shutdown delay, 5 s) while the fleet starts.
	stopped := make(chan error, 1)
	defer func() { go func() { stopped <- b.Stop() }() }()
	t.Cleanup(func() {
		if err := <-stopped; err != nil {
			t.Errorf("stopping the sizing box: %v", err)
		}
	})
	h := "size." + domain
	f.createSpace(b, h)
	b.AdminJSON("POST", "/lchat/routes/"+h+"/wake", nil, 200, nil)
	harness.WaitFor(t, 30*time.Second, "a space's warm set measured", func() bool {
		return gauge(t, b, "lchat_box_warm_set_bytes") > 0
	})
	return int64(gauge(t, b, "lchat_box_warm_set_bytes"))
}

// terminate stops b as a scale-in does: SIGTERM (the box's health check fails at once,
// the balancer counts it down while its listeners are still open, its spaces drain,
// held sockets close with 1012), then the balancer forgets it. It returns how long the
// balancer took to count it down, and the box to exit.
func (f *fleet) terminate(b *lbBox) (down, exit time.Duration) {
	t := f.t
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop() }()
	harness.WaitFor(t, 30*time.Second, b.name+" down in the balancer", func() bool { return f.lb.State(b.name) == "DOWN" })
	down = time.Since(start)
	if b.Exited() {
		t.Errorf("%s exited before the balancer counted it down: its listener closed with the check still passing", b.name)
	}
	if err := <-stopped; err != nil {
		t.Errorf("stopping %s: %v", b.name, err)
	}
	exit = time.Since(start)
	f.lb.DelServer(b.name)
	return down, exit
}

func (f *fleet) createSpace(b *lbBox, host string) {
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, 201, nil)
}

// accessLogged counts b's access log lines by the client address they name.
func accessLogged(b *lbBox) map[string]int {
	out := map[string]int{}
	for _, l := range strings.Split(b.Logs(), "\n") {
		if !strings.Contains(l, `"logger":"http.log.access`) {
			continue
		}
		var e struct {
			Request struct {
				RemoteIP string `json:"remote_ip"`
			} `json:"request"`
		}
		if json.Unmarshal([]byte(l), &e) == nil {
			out[e.Request.RemoteIP]++
		}
	}
	return out
}

// TestScaleOutAndInBehindHAProxy: the test is the autoscaling group, and it scales on the
// fleet's own signal, lchat_fleet_desired_boxes read from a box's /metrics (Prometheus
// text): as more spaces wake the warm set grows past one box's budget and the signal asks
// for more boxes, which the test starts and registers with HAProxy; as spaces go to sleep
// the signal falls and the test drains boxes away, down to one. All the while clients write
// to spaces and hold WebSockets through the balancer. No request fails except with a
// retryable 503, no write answered 201 is lost, a new box holds every route as soon as it
// starts and serves within moments, a stopping box is counted down by the balancer before
// its listener closes, and the boxes log the clients' addresses (the PROXY protocol),
// never the balancer's. Placement is the default, bounded loads: at each phase's end and
// at the peak no box's warm set is past its budget by more than one space.
//
// LCHAT_LB_SPACES and LCHAT_LB_BOXES size a longer run (defaults 4 spaces with clients and
// a peak of 3 boxes); a box's budget is twice the clients' spaces, measured.
func TestScaleOutAndInBehindHAProxy(t *testing.T) {
	spaces, peak := envInt(t, "LCHAT_LB_SPACES", 4), envInt(t, "LCHAT_LB_BOXES", 3)
	f := newFleet(t)
	// A box's budget is room for budgetSpaces spaces: the clients' spaces (which stay
	// awake, and grow as they take writes) fit one box with the signal's headroom and
	// hysteresis; a few more spaces awake ask for a second box.
	size := f.spaceSize()
	budgetSpaces := int64(2 * spaces)
	f.budget = budgetSpaces * size
	first, _ := f.launch()
	var hosts []string
	for i := range spaces {
		h := fmt.Sprintf("room%d.%s", i, domain)
		f.createSpace(first, h)
		hosts = append(hosts, h)
	}
	cl := newClients(t, f.lb.Addr)
	for _, h := range hosts {
		harness.WaitFor(t, 30*time.Second, h+" served through the balancer", func() bool {
			code, _, _ := cl.get(h, "/api/messages")
			return code == 200
		})
	}
	load := cl.start(hosts)
	harness.WaitFor(t, 30*time.Second, "the fleet's warm set published", func() bool {
		return gauge(t, first, "lchat_fleet_warm_set_bytes") > 0
	})
	f.checkBudgets("at the start", size, false)
	if d := desired(t, first); d != 1 {
		t.Fatalf("the signal asks for %d boxes with the clients' %d spaces awake (warm set %.0f bytes, budget %d, a space measured %d alone)",
			d, spaces, gauge(t, first, "lchat_fleet_warm_set_bytes"), f.budget, size)
	}

	var joins, downs, drains []time.Duration
	closedHeld := 0 // WebSockets held by the boxes terminated, as they counted them
	var trace []string
	holders := len(hosts) // held WebSockets kept open (reopened after each close)
	// follow does what an autoscaler does with the signal: start boxes up to it (each one
	// registered with the balancer once up, seeded, serving), or drain boxes down to it.
	follow := func() {
		d := desired(t, first)
		trace = append(trace, fmt.Sprintf("%d→%d", len(f.boxes), d))
		for len(f.boxes) < d {
			b, took := f.launch()
			joins = append(joins, took)
			// Seeded before it served: every route is on it the moment it is up.
			for _, h := range hosts {
				if code, _, err := b.Admin("GET", "/lchat/routes/"+h, nil); err != nil || code != 200 {
					t.Errorf("%s lacks %s once up in the balancer: %d %v", b.name, h, code, err)
				}
			}
			harness.WaitFor(t, 30*time.Second, b.name+" serving the clients", func() bool {
				return accessLogged(b)[writerIP] > 0
			})
			cl.holdMore(load, hosts)
			holders += len(hosts)
		}
		for len(f.boxes) > max(d, 1) {
			b := f.boxes[len(f.boxes)-1]
			// Writes reach it before it goes: the load crosses the drain.
			n := accessLogged(b)[writerIP]
			harness.WaitFor(t, 30*time.Second, b.name+" taking writes before its drain", func() bool {
				return accessLogged(b)[writerIP] > n
			})
			closedHeld += heldOpen(t, b)
			down, exit := f.terminate(b)
			downs, drains = append(downs, down), append(drains, exit)
			f.boxes = f.boxes[:len(f.boxes)-1]
		}
	}

	// Scale-out: more spaces wake (one request each through the balancer; they stay awake),
	// the warm set grows, and the fleet follows the signal up to the peak. The signal lags
	// the wakes by a heartbeat or two, so once the spaces awake (counted at the size of one
	// measured alone) ask for another box with the signal's headroom, the test wakes no
	// more until the signal asks for it: the load stays within what a fleet that follows
	// its signal has room for, and no box's budget is passed by more than one space.
	maxExtra := int(budgetSpaces) * peak
	var extra []string
	for len(f.boxes) < peak {
		awake := int64(len(hosts) + len(extra))
		wanted := float64(awake*size)*(1+mesh.DefaultHeadroom) > float64(int64(len(f.boxes))*f.budget)
		if wanted || len(extra) == maxExtra {
			harness.WaitFor(t, 30*time.Second, fmt.Sprintf("the signal asking for more than %d boxes", len(f.boxes)), func() bool {
				return desired(t, first) > len(f.boxes)
			}, func() string {
				return fmt.Sprintf("%d spaces awake more, fleet warm set %.0f bytes, budget %d a box",
					len(extra), gauge(t, first, "lchat_fleet_warm_set_bytes"), f.budget)
			})
		} else {
			h := fmt.Sprintf("extra%d.%s", len(extra), domain)
			f.createEverywhere(first, h)
			harness.WaitFor(t, 30*time.Second, h+" woken through the balancer", func() bool {
				code, _, _ := cl.get(h, "/api/messages")
				return code == 200
			})
			extra = append(extra, h)
		}
		follow()
	}
	reached, woken := len(f.boxes), len(extra)

	f.checkBudgets("at the peak, scaled out", size, false)

	// New wakes go to the new boxes at once: spaces created now (never awake, so no box
	// remembers a holder of theirs) wake where bounded-load placement puts them among the
	// boxes now live (their owner, or the next with room), when their clients first write.
	for _, b := range f.boxes {
		harness.WaitFor(t, 30*time.Second, b.name+" seeing every box", func() bool { return len(status(t, b).Mesh.Live) == len(f.boxes) })
	}
	var fresh []string
	for i := range spaces {
		h := fmt.Sprintf("new%d.%s", i, domain)
		f.createEverywhere(first, h)
		fresh = append(fresh, h)
		// The first request wakes it (and it stays awake until the scale-in puts it
		// to sleep with the other extra spaces).
		go cl.get(h, "/api/messages")
	}
	wokeOnNew := 0
	for _, h := range fresh {
		var on *lbBox
		harness.WaitFor(t, 30*time.Second, h+" woken by its clients", func() bool {
			on = f.awakeOn(h)
			return on != nil
		}, func() string {
			var w []string
			for _, b := range f.boxes {
				w = append(w, fmt.Sprintf("%s %s awake %v", b.name, b.self, status(t, b).Mesh.Awake))
			}
			return strings.Join(w, "; ")
		})
		if on != first {
			wokeOnNew++
		}
	}
	extra = append(extra, fresh...)
	f.checkBudgets("at the peak, the new spaces awake", size, true)

	// Scale-in: the extra spaces go to sleep one by one (on whichever box holds each), the
	// warm set falls, and the fleet follows the signal down to one box.
	for len(f.boxes) > 1 {
		if len(extra) > 0 {
			h := extra[0]
			extra = extra[1:]
			for _, b := range f.boxes {
				if slices.Contains(status(t, b).Mesh.Awake, h) {
					b.AdminJSON("POST", "/lchat/routes/"+h+"/sleep", nil, 200, nil)
				}
			}
		} else {
			harness.WaitFor(t, 30*time.Second, fmt.Sprintf("the signal asking for fewer than %d boxes", len(f.boxes)), func() bool {
				return desired(t, first) < len(f.boxes)
			}, func() string {
				return fmt.Sprintf("fleet warm set %.0f bytes, budget %d a box", gauge(t, first, "lchat_fleet_warm_set_bytes"), f.budget)
			})
		}
		follow()
	}
	if d := desired(t, first); d != 1 {
		t.Errorf("one box left and the signal asks for %d", d)
	}
	f.checkBudgets("scaled in", size, false)
	if reached < peak {
		t.Errorf("the fleet reached %d boxes, want %d", reached, peak)
	}
	// The load goes on against the one box left, then stops.
	n := accessLogged(first)[writerIP]
	harness.WaitFor(t, 30*time.Second, "writes served by the last box", func() bool { return accessLogged(first)[writerIP] > n+len(hosts) })
	r := load.stop()

	// Every write answered 201 is there, read through the balancer.
	lost := 0
	for _, h := range hosts {
		got, err := cl.texts(h)
		if err != nil {
			t.Fatalf("reading %s: %v", h, err)
		}
		for _, text := range r.acked[h] {
			if !got[text] {
				lost++
				t.Errorf("%s: %q was answered 201 and is gone", h, text)
			}
		}
	}
	// Every holder got its WebSocket held at least once (a box that cannot hold it
	// answers 503, which a holder retries, forever).
	if r.wsOpened < holders {
		t.Errorf("%d WebSockets opened for %d holders (%d refused with 503)", r.wsOpened, holders, r.wsRetryable)
	}
	if r.ws1012 < closedHeld {
		t.Errorf("the terminated boxes held %d WebSockets, and their clients got %d closes with 1012", closedHeld, r.ws1012)
	}
	for _, fl := range r.failures {
		t.Errorf("failed request: %s", fl)
	}
	for _, b := range f.all {
		logged := accessLogged(b)
		if logged[lbSource] > 0 {
			t.Errorf("%s logged %d requests from the balancer's address %s: the PROXY header was not used", b.name, logged[lbSource], lbSource)
		}
		if logged[writerIP] == 0 {
			t.Errorf("%s logged no request from the client %s: %v", b.name, writerIP, logged)
		}
	}
	var fill []string
	for _, b := range f.all {
		fill = append(fill, fmt.Sprintf("%s %.2f", b.name, f.fullest[b.name]))
	}
	t.Logf("figures: fullest warm set over budget read at the phases' ends: %s", strings.Join(fill, ", "))
	t.Logf("figures: boxes 1→%d→1 on lchat_fleet_desired_boxes (boxes→signal at each step: %s), %d spaces with clients and %d more woken to grow the warm set (budget %d MiB a box, %d spaces of %d MiB): "+
		"%d writes acknowledged, %d failed, %d retryable 503s, %d acknowledged writes lost; "+
		"spaces created at %d boxes woken on the new ones %d of %d; WebSockets: %d opened, %d held by the boxes terminated, %d closed with 1012, %d refused with a retryable 503; join (start to up in HAProxy): %v; terminate: SIGTERM to down in HAProxy %v, to exit %v",
		reached, strings.Join(trace, " "), spaces, woken, f.budget>>20, budgetSpaces, size>>20, r.total(), len(r.failures), r.retryable, lost, reached, wokeOnNew, len(fresh), r.wsOpened, closedHeld, r.ws1012, r.wsRetryable, joins, downs, drains)
}

// createEverywhere creates host on b and waits until every running box holds its route,
// so that the balancer may send its first request to any of them.
func (f *fleet) createEverywhere(b *lbBox, host string) {
	f.createSpace(b, host)
	for _, o := range f.boxes {
		harness.WaitFor(f.t, 30*time.Second, host+" replicated to "+o.name, func() bool {
			code, _, err := o.Admin("GET", "/lchat/routes/"+host, nil)
			return err == nil && code == 200
		})
	}
}

// desired is the autoscaling signal as b publishes it on /metrics.
func desired(t *testing.T, b *lbBox) int {
	return int(gauge(t, b, "lchat_fleet_desired_boxes"))
}

// awakeOn is the running box host is awake on, nil when none.
func (f *fleet) awakeOn(host string) *lbBox {
	for _, b := range f.boxes {
		if slices.Contains(status(f.t, b).Mesh.Awake, host) {
			return b
		}
	}
	return nil
}

// checkBudgets checks that no running box's warm set has passed its budget by more than
// one space (size, measured alone): bounded-load placement wakes a space on a box only
// while the box's warm set with it stays within its budget, unless no box has room, and
// then on the lightest. It reads each box's warm set as published (what placement and the
// signal read), or with settle one measured after now (two heartbeats: each measures at its
// start), and keeps each box's fullest reading for the figures.
func (f *fleet) checkBudgets(phase string, size int64, settle bool) {
	t := f.t
	from := map[*lbBox]float64{}
	for _, b := range f.boxes {
		from[b] = gauge(t, b, beats)
	}
	for _, b := range f.boxes {
		harness.WaitFor(t, 10*time.Second, b.name+" measuring its warm set", func() bool { return !settle || gauge(t, b, beats) >= from[b]+2 })
	}
	for _, b := range f.boxes {
		warm, budget := gauge(t, b, "lchat_box_warm_set_bytes"), gauge(t, b, "lchat_box_memory_budget_bytes")
		if budget != float64(f.budget) {
			t.Errorf("%s %s: lchat_box_memory_budget_bytes %.0f, configured %d", phase, b.name, budget, f.budget)
		}
		if warm > budget+float64(size) {
			t.Errorf("%s: %s's warm set is %.0f bytes, %.2f× its budget of %.0f: past it by more than one space (%d bytes); awake %v",
				phase, b.name, warm, warm/budget, budget, size, status(t, b).Mesh.Awake)
		}
		f.fullest[b.name] = max(f.fullest[b.name], warm/budget)
	}
}

// beats is the series of a box's heartbeats begun.
const beats = `lchat_mesh_membership_total{counter="beats"}`

// boxStatus is what the test reads of GET /lchat/status.
type boxStatus struct {
	Mesh struct {
		Awake []string `json:"awake"`
		Live  []string `json:"live_members"`
	} `json:"mesh"`
}

func status(t *testing.T, b *lbBox) boxStatus {
	var st boxStatus
	b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	return st
}

// heldOpen is how many WebSockets b holds open (lchat_conns{state="open"}).
func heldOpen(t *testing.T, b *lbBox) int {
	return int(gauge(t, b, `lchat_conns{state="open"}`))
}

// gauge is the value of the series named (with its labels, as the Prometheus text format
// writes them) on b's /metrics, as a scraper reads it; 0 when b publishes none.
func gauge(t *testing.T, b *lbBox, series string) float64 {
	code, body, err := b.Admin("GET", "/metrics", nil)
	if err != nil || code != 200 {
		t.Fatalf("%s /metrics: %d %v", b.name, code, err)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s /metrics: %q: %v", b.name, l, err)
			}
			return n
		}
	}
	return 0
}

func envInt(t *testing.T, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", name, v)
		}
		return n
	}
	return def
}

// results is what the clients saw.
type results struct {
	mu          sync.Mutex
	acked       map[string][]string // host -> texts answered 201
	failures    []string
	retryable   int
	wsOpened    int
	ws1012      int
	wsRetryable int
}

func (r *results) total() int {
	n := 0
	for _, a := range r.acked {
		n += len(a)
	}
	return n
}

func (r *results) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
