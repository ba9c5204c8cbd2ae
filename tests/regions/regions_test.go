// Package regions runs boxes of two regions, fi and ie, as real lchat-caddy processes on
// 127.0.0.x against one real S3 (versitygw) with the real demo space, and checks region
// placement end to end: a space homed in fi wakes only on fi boxes while one is live,
// falls back to the whole fleet when none is, and returns to fi once a fi box is back;
// rows homed in a region reach that region's boxes even when the host is outside their
// mesh domains.
package regions

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	meshDomain = "mesh.test"
	meshToken  = "regions-mesh-token-5c2e91-7a3f0d9b1e4c"
	beat       = time.Second
	deadAfter  = 3 * time.Second
	// idle is the demo kind's idle timeout: short, so the test can watch a space
	// sleep where it fell back and wake at home again.
	idle = 3 * time.Second
)

// node is one box: SELF is plain HTTP on its own loopback address.
type node struct {
	*harness.Box
	name, ip, region, addr, self string
}

type fleet struct {
	t      *testing.T
	s3     *harness.S3
	prefix string
	bkt    bucket.Bucket
	nodes  []*node
}

func newFleet(t *testing.T) *fleet {
	s3 := harness.StartS3(t)
	prefix := fmt.Sprintf("r%d", time.Now().UnixNano()%1e9)
	return &fleet{t: t, s3: s3, prefix: prefix, bkt: s3.NewBucket(t, prefix)}
}

// config is one box's JSON config: the lchat app on the shared bucket with short mesh
// intervals and the demo kind, the peer API on the SELF address and the lchat handler
// for the rest.
func (f *fleet) config(n *node) string {
	return harness.Config{
		Listen:      n.addr,
		MeshAPIHost: n.ip,
		Lchat: map[string]any{
			"mesh": map[string]any{"beat": beat.String(), "dead_after": deadAfter.String()},
			"kinds": map[string]any{"demo": harness.DemoKind(map[string]any{
				"idle_timeout": idle.String(), "replication": map[string]any{"class": "sleep"},
			})},
		},
	}.JSON()
}

// start starts a box of region on the next loopback address.
func (f *fleet) start(name, region string) *node {
	t := f.t
	t.Helper()
	ip := fmt.Sprintf("127.0.0.%d", 21+len(f.nodes))
	addr := harness.FreeAddr(t, ip)
	n := &node{name: name, ip: ip, region: region, addr: addr, self: "http://" + addr}
	env := append(f.s3.Env(f.prefix), mesh.EnvSelf+"="+n.self, mesh.EnvDomains+"="+meshDomain,
		mesh.EnvToken+"="+meshToken, "LCHAT_MESH_REGION="+region)
	n.Box = harness.StartBox(t, harness.BoxOptions{JSON: f.config(n), Env: env, IP: ip})
	f.nodes = append(f.nodes, n)
	return n
}

// live is the live fleet as box n sees it.
func live(n *node) []string {
	var st struct {
		Mesh *struct {
			Live []string `json:"live_members"`
		} `json:"mesh"`
	}
	code, data, err := n.Admin("GET", "/lchat/status", nil)
	if err != nil || code != 200 || json.Unmarshal(data, &st) != nil || st.Mesh == nil {
		return nil
	}
	slices.Sort(st.Mesh.Live)
	return st.Mesh.Live
}

func selves(nodes ...*node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.self)
	}
	slices.Sort(out)
	return out
}

// members is nodes as mesh members, for predicting placement.
func members(nodes ...*node) []mesh.Member {
	var out []mesh.Member
	for _, n := range nodes {
		out = append(out, mesh.Member{Self: n.self, Region: n.region})
	}
	return out
}

// waitView waits until every box in viewers sees exactly want as live.
func waitView(t *testing.T, viewers []*node, want ...*node) {
	t.Helper()
	w := selves(want...)
	harness.WaitFor(t, 20*time.Second, fmt.Sprintf("views of %v", w), func() bool {
		for _, n := range viewers {
			if !slices.Equal(live(n), w) {
				return false
			}
		}
		return true
	}, func() string {
		var out []string
		for _, n := range viewers {
			out = append(out, fmt.Sprintf("%s sees %v", n.name, live(n)))
		}
		return strings.Join(out, "; ")
	})
}

// do sends a request for host through box n.
func do(n *node, method, host, path, body string) (int, string, error) {
	req, err := http.NewRequest(method, "http://"+n.addr+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Host = host
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), nil
}

// post posts a chat message to host through n and fails unless it is created.
func post(t *testing.T, n *node, host, text string) {
	t.Helper()
	code, body, err := do(n, "POST", host, "/api/messages", fmt.Sprintf(`{"author":"t","text":%q}`, text))
	if err != nil || code != http.StatusCreated {
		t.Fatalf("POST %s via %s: %d %v %.300s", host, n.name, code, err, body)
	}
}

// lease reads host's lease from the bucket: the box that last woke it, and whether it
// has been released (the space is asleep).
func (f *fleet) lease(host string) (spacestore.Lease, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obj, err := f.bkt.Get(ctx, "spaces/"+host+"/lease")
	if err != nil {
		return spacestore.Lease{}, false
	}
	defer obj.Body.Close()
	var l spacestore.Lease
	raw, _ := io.ReadAll(obj.Body)
	if json.Unmarshal(raw, &l) != nil {
		return spacestore.Lease{}, false
	}
	return l, true
}

// awakeOn lists the boxes among nodes whose status says host is awake.
func awakeOn(host string, nodes ...*node) []string {
	var out []string
	for _, n := range nodes {
		var st struct {
			Spaces []struct {
				Host  string `json:"host"`
				State string `json:"state"`
			} `json:"spaces"`
		}
		code, data, err := n.Admin("GET", "/lchat/status", nil)
		if err != nil || code != 200 || json.Unmarshal(data, &st) != nil {
			continue
		}
		for _, s := range st.Spaces {
			if s.Host == host && s.State != "asleep" && s.State != "stopped" && s.State != "idle" && s.State != "" {
				out = append(out, n.name)
			}
		}
	}
	return out
}

// fanouts is n's count of fan-out results so far, and of those that failed.
func fanouts(n *node) (total, failed uint64) {
	var st struct {
		Mesh *struct {
			Counters map[string]uint64 `json:"counters"`
		} `json:"mesh"`
	}
	code, data, err := n.Admin("GET", "/lchat/status", nil)
	if err != nil || code != 200 || json.Unmarshal(data, &st) != nil || st.Mesh == nil {
		return 0, 0
	}
	return st.Mesh.Counters["fanouts"], st.Mesh.Counters["fanout_errors"]
}

func hasRoute(n *node, host string) bool {
	code, _, err := n.Admin("GET", "/lchat/routes/"+host, nil)
	return err == nil && code == 200
}

func (f *fleet) byself(self string) string {
	for _, n := range f.nodes {
		if n.self == self {
			return n.name
		}
	}
	return self
}

// TestHomeRegionPlacement: two fi boxes and two ie boxes on one bucket. Spaces homed in
// fi, entered through every box, wake only on their HRW owner among the fi boxes. With
// both fi boxes gone (one drained, one killed) they fall back to the ie boxes; when a fi
// box is back, a space that fell back sleeps where it was and its next wake, entered
// through an ie box, is in fi again.
func TestHomeRegionPlacement(t *testing.T) {
	f := newFleet(t)
	fi1, fi2 := f.start("fi1", "fi"), f.start("fi2", "fi")
	ie1, ie2 := f.start("ie1", "ie"), f.start("ie2", "ie")
	all := []*node{fi1, fi2, ie1, ie2}
	waitView(t, all, all...)

	// Spaces homed in fi, created on an ie box: every box covers mesh.test, so the row
	// reaches all four. The hosts are picked so that each fi box owns some at home and
	// each ie box some in the fallback, in every combination.
	var hosts []string
	seen := map[[2]string]bool{}
	for i := 0; len(hosts) < 4; i++ {
		host := fmt.Sprintf("fi%d.%s", i, meshDomain)
		home, _ := mesh.Owner(host, members(all...), "fi")
		away, _ := mesh.Owner(host, members(ie1, ie2), "fi")
		if k := [2]string{home.Self, away.Self}; !seen[k] {
			seen[k] = true
			hosts = append(hosts, host)
		}
	}
	for _, host := range hosts {
		ie1.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo", "home_region": "fi"}, http.StatusCreated, nil)
	}
	for _, h := range hosts {
		harness.WaitFor(t, 10*time.Second, h+" replicated to every box", func() bool {
			for _, n := range all {
				if !hasRoute(n, h) {
					return false
				}
			}
			return true
		})
	}

	// While fi has live boxes: through every box, each space wakes on its owner among
	// the fi boxes, and nowhere else.
	for _, h := range hosts {
		want, _ := mesh.Owner(h, members(all...), "fi")
		for i, n := range []*node{ie2, ie1, fi1, fi2} {
			post(t, n, h, fmt.Sprintf("at home %d", i))
			if got := awakeOn(h, all...); !slices.Equal(got, []string{f.byself(want.Self)}) {
				t.Fatalf("%s (home fi) entered via %s is awake on %v, want only %s", h, n.name, got, f.byself(want.Self))
			}
		}
		if l, ok := f.lease(h); !ok || l.Holder != want.Self {
			t.Fatalf("%s: lease holder %q, want the fi owner %s", h, l.Holder, want.Self)
		}
	}

	// No fi box: one drains, the other dies. The spaces fall back to the ie boxes.
	if err := fi2.Stop(); err != nil {
		t.Fatalf("draining fi2: %v", err)
	}
	fi1.Kill()
	ie := []*node{ie1, ie2}
	waitView(t, ie, ie...)
	for _, h := range hosts {
		want, _ := mesh.Owner(h, members(ie...), "fi")
		// fi1's leases stay held until its heartbeat is dead_after old; the view above
		// already dropped it, so the first wake may still find the lease and retry.
		var code int
		var body string
		harness.WaitFor(t, 20*time.Second, h+" served while fi has no live box", func() bool {
			var err error
			code, body, err = do(ie2, "POST", h, "/api/messages", `{"author":"t","text":"fallback"}`)
			return err == nil && code == http.StatusCreated
		}, func() string { return fmt.Sprintf("last answer %d %.200s", code, body) })
		post(t, ie1, h, "fallback via ie1")
		// ie2 asks again while the space is awake, so it knows where (it will have to
		// forget that once the space sleeps there).
		post(t, ie2, h, "fallback via ie2")
		if got := awakeOn(h, ie...); !slices.Equal(got, []string{f.byself(want.Self)}) {
			t.Fatalf("%s with fi down is awake on %v, want its fleet owner %s", h, got, f.byself(want.Self))
		}
		if l, _ := f.lease(h); l.Holder != want.Self {
			t.Fatalf("%s with fi down: lease holder %q, want %s", h, l.Holder, want.Self)
		}
		// What was written at home is still there when its box drained (the demo kind
		// checkpoints at sleep only, so a killed box's writes since its wake are gone).
		code, body, err := do(ie1, "GET", h, "/api/messages", "")
		home, _ := mesh.Owner(h, members(all...), "fi")
		drained := home.Self == fi2.self
		if err != nil || code != 200 || drained && !strings.Contains(body, "at home 3") || !strings.Contains(body, "fallback via ie1") {
			t.Fatalf("%s after fallback (home box drained: %v): %d %v %.300s", h, drained, code, err, body)
		}
	}

	// fi1 comes back (same SELF, a new incarnation). Once every box sees it, each
	// space sleeps where it fell back (a space stays where it is awake) and its next
	// wake, entered through an ie box, is on fi1.
	fi1.Start()
	back := []*node{fi1, ie1, ie2}
	waitView(t, back, back...)
	for _, h := range hosts {
		harness.WaitFor(t, idle+20*time.Second, h+" asleep after the fallback", func() bool {
			l, ok := f.lease(h)
			return ok && l.Released && len(awakeOn(h, back...)) == 0
		})
	}
	for _, h := range hosts {
		post(t, ie2, h, "home again")
		if got := awakeOn(h, back...); !slices.Equal(got, []string{"fi1"}) {
			t.Fatalf("%s with fi1 back is awake on %v, want fi1", h, got)
		}
		if l, _ := f.lease(h); l.Holder != fi1.self {
			t.Fatalf("%s with fi1 back: lease holder %q, want fi1", h, l.Holder)
		}
		code, body, err := do(ie1, "GET", h, "/api/messages", "")
		if err != nil || code != 200 || !strings.Contains(body, "fallback via ie1") || !strings.Contains(body, "home again") {
			t.Fatalf("%s back home: %d %v %.300s", h, code, err, body)
		}
	}
}

// TestRowsFanOutByHomeRegion: every box covers mesh.test. A row for a host outside
// every box's domains, homed in fi, reaches the fi boxes (they place it) and no ie box;
// one homed in ie reaches the ie boxes only. Entered through either fi box, the fi row
// wakes on its owner; an ie box answers 404. A fi row created on an ie box (outside its
// scope) still wakes in fi when entered there, and mesh-seed --region fi gives a new fi
// box the fi rows outside its domains.
func TestRowsFanOutByHomeRegion(t *testing.T) {
	f := newFleet(t)
	fi1, fi2 := f.start("fi1", "fi"), f.start("fi2", "fi")
	ie1, ie2 := f.start("ie1", "ie"), f.start("ie2", "ie")
	all := []*node{fi1, fi2, ie1, ie2}
	waitView(t, all, all...)

	cases := []struct {
		host, region string
		origin       *node
		want, not    []*node
	}{
		{"a.elsewhere.test", "fi", fi1, []*node{fi2}, []*node{ie1, ie2}},
		{"b.elsewhere.test", "ie", ie2, []*node{ie1}, []*node{fi1, fi2}},
	}
	for _, c := range cases {
		before, _ := fanouts(c.origin)
		c.origin.AdminJSON("POST", "/lchat/routes", map[string]any{"host": c.host, "kind": "demo", "home_region": c.region}, http.StatusCreated, nil)
		for _, n := range c.want {
			harness.WaitFor(t, 10*time.Second, c.host+" replicated to "+n.name, func() bool { return hasRoute(n, c.host) })
		}
		// The origin sent the row to exactly the wanted peers: one result each, no
		// refusal (a peer outside the row's scope answers 400). Results arrive
		// asynchronously; a beat is ample for a stray one to show.
		harness.WaitFor(t, 10*time.Second, "fan-out results of "+c.host, func() bool {
			n, _ := fanouts(c.origin)
			return n >= before+uint64(len(c.want))
		})
		time.Sleep(beat)
		if n, errs := fanouts(c.origin); n != before+uint64(len(c.want)) || errs != 0 {
			t.Errorf("%s: %s fanned out %d rows (%d refused), want %d to %d peers", c.host, c.origin.name, n-before, errs, len(c.want), len(c.want))
		}
		for _, n := range c.not {
			if hasRoute(n, c.host) {
				t.Errorf("%s (outside every box's domains, homed in %s) reached %s of region %s", c.host, c.region, n.name, n.region)
			}
		}
	}

	// The fi boxes place a.elsewhere.test among themselves: entered through either, it
	// wakes on its owner.
	host := cases[0].host
	want, _ := mesh.Owner(host, members(all...), "fi")
	for _, n := range []*node{fi1, fi2} {
		post(t, n, host, "via "+n.name)
		if got := awakeOn(host, all...); !slices.Equal(got, []string{f.byself(want.Self)}) {
			t.Fatalf("%s entered via %s is awake on %v, want %s", host, n.name, got, f.byself(want.Self))
		}
	}
	// An ie box has no row for it: a 404, not a wake in ie.
	if code, _, err := do(ie1, "GET", host, "/api/messages", ""); err != nil || code != http.StatusNotFound {
		t.Fatalf("%s via ie1: %d %v, want 404", host, code, err)
	}

	// A row homed in fi created on an ie box, for a host outside the ie box's domains:
	// it reaches the fi boxes, and a request entering through the ie box that holds it
	// still wakes the space in fi.
	odd := "c.elsewhere.test"
	ie1.AdminJSON("POST", "/lchat/routes", map[string]any{"host": odd, "kind": "demo", "home_region": "fi"}, http.StatusCreated, nil)
	for _, n := range []*node{fi1, fi2} {
		harness.WaitFor(t, 10*time.Second, odd+" replicated to "+n.name, func() bool { return hasRoute(n, odd) })
	}
	oddOwner, _ := mesh.Owner(odd, members(all...), "fi")
	post(t, ie1, odd, "via ie1")
	if got := awakeOn(odd, all...); !slices.Equal(got, []string{f.byself(oddOwner.Self)}) {
		t.Errorf("%s (homed in fi, created on ie1) entered via ie1 is awake on %v, want its fi owner %s", odd, got, f.byself(oddOwner.Self))
	}

	// A peer seeded with --region gets the rows homed in its region that lie outside
	// its domains: mesh-seed --region fi from fi1 to a fresh fi box.
	fi3 := f.start("fi3", "fi")
	waitView(t, []*node{fi3}, append(all, fi3)...)
	out, err := fi1.CLI("mesh-seed", "--region", "fi", fi3.self)
	if err != nil {
		t.Fatalf("mesh-seed --region fi: %v\n%s", err, out)
	}
	harness.WaitFor(t, 10*time.Second, host+" seeded to fi3", func() bool { return hasRoute(fi3, host) })
	if hasRoute(fi3, cases[1].host) {
		t.Errorf("mesh-seed --region fi gave fi3 %s, homed in ie", cases[1].host)
	}
}
