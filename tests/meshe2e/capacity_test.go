package meshe2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/adminapi"
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
