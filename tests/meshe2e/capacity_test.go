package meshe2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestWakesGoWhereThereIsRoom: two boxes; every space is one whose HRW owner is box A, and
// every request enters through A. As A's awake spaces grow its warm set (published in its
// heartbeat, read from the listing by both boxes), the wakes that follow go to B, which has
// room, while A is still under its max_awake: the cap never refuses or evicts, although
// plain HRW would have put every one of them on A. The metrics of the autoscaling signal
// are on both boxes' /metrics and in lchat-caddy fleet.
func TestWakesGoWhereThereIsRoom(t *testing.T) {
	c := newCluster(t)
	const maxAwake = 6
	// A small budget, so a demo space's few MiB move the published warm set (by steps of
	// budget/32).
	c.mesh = map[string]any{"memory_budget": 128 << 20}
	c.lchat = map[string]any{"max_awake": maxAwake}
	a := c.start(false)
	b := c.start(false)
	harness.WaitFor(t, 5*time.Second, "both boxes see two live members", func() bool {
		return len(status(t, a).Mesh.Live) == 2 && len(status(t, b).Mesh.Live) == 2
	})
	// publishedWarm is A's warm set as A's own listing shows it.
	publishedWarm := func(n *node) (map[string]int64, *adminapi.FleetCapacity) {
		var f adminapi.Fleet
		n.AdminJSON("GET", "/lchat/fleet", nil, 200, &f)
		out := map[string]int64{}
		for _, m := range f.Members {
			out[m.Self] = m.WarmSet
		}
		return out, f.Capacity
	}

	const spaces = maxAwake
	var hosts []string
	for i := 0; len(hosts) < spaces; i++ {
		h := hostOwnedBy(t, fmt.Sprintf("cap%d-", i), a, a, b)
		hosts = append(hosts, h)
		c.createSpace(a, h)
	}
	harness.WaitFor(t, 5*time.Second, "rows on B", func() bool { return hasRoute(b, hosts[len(hosts)-1]) })

	onA, onB := 0, 0
	for i, h := range hosts {
		before, _ := publishedWarm(a)
		c.post(a, h, "hello")
		switch where := awakeOn(t, h, a, b); {
		case len(where) == 1 && where[0] == a.self:
			onA++
		case len(where) == 1 && where[0] == b.self:
			onB++
		default:
			t.Fatalf("wake %d (%s) is awake on %v", i+1, h, where)
		}
		// The next wake is placed on the loads this one left: wait until A's listing
		// shows the warm set of the box that woke it grown.
		woke := awakeOn(t, h, a, b)[0]
		harness.WaitFor(t, 10*time.Second, "the warm set of "+woke+" published", func() bool {
			now, _ := publishedWarm(a)
			return now[woke] > before[woke]
		})
	}
	warm, capy := publishedWarm(a)
	t.Logf("FIGURE %d wakes of spaces HRW places on A, all entering through A: %d woke on A, %d on B (A's warm set %d MiB, B's %d MiB; max_awake %d)",
		spaces, onA, onB, warm[a.self]>>20, warm[b.self]>>20, maxAwake)
	if onB == 0 {
		t.Errorf("every wake went to A, none to B, which had room")
	}
	if onA == 0 {
		t.Errorf("no wake stayed on A, the HRW owner, although it had room at first")
	}
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	a.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	if st.Counters["cap_refusals"] != 0 {
		t.Errorf("A refused %d wakes at max_awake", st.Counters["cap_refusals"])
	}
	if n := len(status(t, a).Mesh.Live); n != 2 {
		t.Fatalf("A sees %d members", n)
	}
	for _, h := range hosts {
		if len(awakeOn(t, h, a, b)) != 1 {
			t.Errorf("%s is not awake on exactly one box: max_awake slept it, or it woke twice", h)
		}
	}

	// The autoscaling signal: in lchat-caddy fleet and on every box's /metrics.
	if capy == nil || capy.DesiredBoxes < 1 || capy.BoxBudgetOwn != 128<<20 || capy.BoxWarmSet <= 0 {
		t.Errorf("GET /lchat/fleet capacity = %+v, want a desired count, A's budget 128 MiB and its warm set", capy)
	}
	out, err := a.CLI("fleet")
	if err != nil {
		t.Fatalf("lchat-caddy fleet: %v\n%s", err, out)
	}
	for _, want := range []string{"WARM SET", "BUDGET", "128 MiB", "lchat_fleet_desired_boxes ", "lchat_box_warm_set_bytes "} {
		if !strings.Contains(out, want) {
			t.Errorf("lchat-caddy fleet does not show %q:\n%s", want, out)
		}
	}
	for _, n := range []*node{a, b} {
		code, body, err := n.Admin("GET", "/metrics", nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s /metrics: %d %v", n.self, code, err)
		}
		metrics := map[string]float64{}
		for _, line := range strings.Split(string(body), "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "lchat_") {
				v, _ := strconv.ParseFloat(f[1], 64)
				metrics[f[0]] = v
			}
		}
		for _, name := range []string{"lchat_fleet_desired_boxes", "lchat_box_warm_set_bytes", "lchat_box_memory_budget_bytes", "lchat_fleet_warm_set_bytes"} {
			if _, ok := metrics[name]; !ok {
				t.Errorf("%s /metrics has no %s", n.self, name)
			}
		}
		if metrics["lchat_box_memory_budget_bytes"] != 128<<20 || metrics["lchat_box_warm_set_bytes"] <= 0 || metrics["lchat_fleet_desired_boxes"] < 1 {
			t.Errorf("%s: budget %v, warm set %v, desired boxes %v", n.self, metrics["lchat_box_memory_budget_bytes"],
				metrics["lchat_box_warm_set_bytes"], metrics["lchat_fleet_desired_boxes"])
		}
	}
}

// TestFullBoxSendsTheWakeOn: two boxes with max_awake 1. Every space is one whose HRW owner
// is box A, and every request enters through A. With A's one awake space held in use by an
// open event stream, A refuses the next wake at its cap, and the request goes on to B,
// which has room, instead of a 503: the space wakes on B and the write is answered 201.
// Once B is full too, a wake goes round the boxes at most mesh.PlaceHops times and is
// refused with 503 and Retry-After. Each space put to sleep leaves its size record naming
// the box it ran on (spaces/<host>/size's box is that box's SELF).
func TestFullBoxSendsTheWakeOn(t *testing.T) {
	c := newCluster(t)
	c.lchat = map[string]any{"max_awake": 1}
	a := c.start(false)
	b := c.start(false)
	harness.WaitFor(t, 5*time.Second, "both boxes see two live members", func() bool {
		return len(status(t, a).Mesh.Live) == 2 && len(status(t, b).Mesh.Live) == 2
	})
	var hosts []string
	for i := range 3 {
		h := hostOwnedBy(t, fmt.Sprintf("full%d-", i), a, a, b)
		hosts = append(hosts, h)
		c.createSpace(a, h)
	}
	held, moved, refused := hosts[0], hosts[1], hosts[2]
	harness.WaitFor(t, 5*time.Second, "rows on B", func() bool { return hasRoute(b, refused) })

	// stream holds host's space in use through A: an event stream open until closed.
	streams := map[string]func(){}
	stream := func(host string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+host+"/api/events", nil)
		resp, err := c.client(a).Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("event stream of %s through A: %v %v", host, resp, err)
		}
		streams[host] = func() { cancel(); resp.Body.Close() }
	}
	stream(held)
	if where := awakeOn(t, held, a, b); !slices.Equal(where, []string{a.self}) {
		t.Fatalf("%s, owned by A, is awake on %v", held, where)
	}

	c.post(a, moved, "hello") // 201, or the test fails: a 503 is the cap's refusal
	if where := awakeOn(t, moved, a, b); !slices.Equal(where, []string{b.self}) {
		t.Fatalf("%s, refused by a full A, is awake on %v, want on B", moved, where)
	}
	if n := capRefusals(t, a); n == 0 {
		t.Errorf("A counted no refusal at its cap: the wake did not reach it")
	}

	// B full too: the wake goes from box to box until its hops run out, then 503.
	stream(moved)
	code, hdr, body, err := c.doH(a, "POST", refused, "/api/messages", `{"author":"test","text":"x"}`, nil)
	if err != nil || code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("a wake with both boxes full: %d Retry-After %q %v: %.200s, want 503 with Retry-After", code, hdr.Get("Retry-After"), err, body)
	}
	if where := awakeOn(t, refused, a, b); len(where) != 0 {
		t.Fatalf("%s woke on %v over both boxes' caps", refused, where)
	}
	if na, nb := capRefusals(t, a), capRefusals(t, b); nb == 0 || na < 2 {
		t.Errorf("cap refusals: A %d, B %d; want the refused wake tried on both", na, nb)
	}

	// The size records name the box each space ran on. A space's size is its peak over the
	// beats of its wake: wait until a beat measured both (their boxes' warm sets published).
	harness.WaitFor(t, 10*time.Second, "both boxes' warm sets published", func() bool {
		var f adminapi.Fleet
		a.AdminJSON("GET", "/lchat/fleet", nil, 200, &f)
		warm := 0
		for _, m := range f.Members {
			if m.WarmSet > 0 {
				warm++
			}
		}
		return warm == 2
	})
	bkt := c.s3.NewBucket(t, c.prefix)
	for host, n := range map[string]*node{held: a, moved: b} {
		streams[host]()
		n.AdminJSON("POST", "/lchat/routes/"+host+"/sleep", nil, http.StatusOK, nil)
		var rec mesh.SizeRecord
		harness.WaitFor(t, 10*time.Second, "the size record of "+host, func() bool {
			var err error
			rec, err = mesh.ReadSize(context.Background(), bkt, host)
			return err == nil
		})
		if rec.Box != n.self || rec.Bytes <= 0 {
			t.Errorf("size record of %s, run on %s: %+v, want its box named and its bytes", host, n.self, rec)
		}
	}
}

// capRefusals is n's count of wakes refused at max_awake.
func capRefusals(t *testing.T, n *node) uint64 {
	t.Helper()
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	n.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	return st.Counters["cap_refusals"]
}

// TestScheduledWakeFiresOnTheTarget: a due scheduled wake fires on the box a request would
// wake its space on, not on its plain HRW owner. Two boxes with a budget so small that one
// awake space fills box A past half of it: a space A owns, with a due wake and no request,
// is woken by B, which has room, and its wake delivered (the record deleted).
func TestScheduledWakeFiresOnTheTarget(t *testing.T) {
	c := newCluster(t)
	c.mesh = map[string]any{"memory_budget": 4 << 20}
	a := c.start(false)
	b := c.start(false)
	harness.WaitFor(t, 5*time.Second, "both boxes see two live members", func() bool {
		return len(status(t, a).Mesh.Live) == 2 && len(status(t, b).Mesh.Live) == 2
	})
	filler := hostOwnedBy(t, "filler-", a, a, b)
	woken := hostOwnedBy(t, "sched-", a, a, b)
	c.createSpace(a, filler)
	c.createSpace(a, woken)
	harness.WaitFor(t, 5*time.Second, "rows on B", func() bool { return hasRoute(b, woken) })
	c.post(a, filler, "hello")
	if where := awakeOn(t, filler, a, b); !slices.Equal(where, []string{a.self}) {
		t.Fatalf("%s, owned by A and woken first, is awake on %v", filler, where)
	}
	// Both boxes place wakes on A's published warm set: wait until both listings show it.
	harness.WaitFor(t, 10*time.Second, "A's warm set in both boxes' listings", func() bool {
		for _, n := range []*node{a, b} {
			var f adminapi.Fleet
			n.AdminJSON("GET", "/lchat/fleet", nil, 200, &f)
			for _, m := range f.Members {
				if m.Self == a.self && m.WarmSet == 0 {
					return false
				}
			}
		}
		return true
	})
	bkt := c.s3.NewBucket(t, c.prefix)
	if _, err := spacestore.PutWake(context.Background(), bkt, woken, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 15*time.Second, "the scheduled wake delivered", func() bool {
		_, err := bkt.Head(context.Background(), spacestore.WakeKey(woken))
		return errors.Is(err, bucket.ErrNotFound)
	})
	if where := awakeOn(t, woken, a, b); !slices.Equal(where, []string{b.self}) {
		t.Fatalf("%s, owned by A, full, woke for its scheduled wake on %v, want on B", woken, where)
	}
}
