package meshe2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// startBehindProxy starts the next box with its SELF (what peers dial for fan-out and
// forwarding) on a TCP proxy on the box's own IP that delays each new connection by a
// random 0-1.5s: requests sent in one order arrive in another.
func (c *cluster) startBehindProxy() (*node, *harness.TCPProxy) {
	t := c.t
	t.Helper()
	ip := fmt.Sprintf("127.0.0.%d", len(c.nodes)+1)
	n := &node{ip: ip}
	n.addr = net.JoinHostPort(ip, harness.FreePort(t, ip))
	p := harness.StartTCPProxyOn(t, ip, n.addr)
	p.SetJitter(1500 * time.Millisecond)
	n.self = "https://" + p.Addr()
	env := append(c.s3.Env(c.prefix),
		mesh.EnvSelf+"="+n.self,
		mesh.EnvDomains+"="+meshDomain,
		mesh.EnvToken+"="+meshToken,
	)
	n.Box = harness.StartBox(t, harness.BoxOptions{JSON: c.boxConfig(n), Env: env, IP: ip})
	c.nodes = append(c.nodes, n)
	return n, p
}

// routeRevs lists a box's routes as host -> "rev hibernate".
func routeRevs(t *testing.T, n *node) map[string]string {
	t.Helper()
	var page struct {
		Routes []struct {
			Host      string `json:"host"`
			Hibernate bool   `json:"hibernate"`
			Rev       string `json:"rev"`
		} `json:"routes"`
	}
	n.AdminJSON("GET", "/lchat/routes?limit=1000", nil, http.StatusOK, &page)
	out := map[string]string{}
	for _, r := range page.Routes {
		out[r.Host] = fmt.Sprintf("%s %t", r.Rev, r.Hibernate)
	}
	return out
}

// TestReplicationConvergesThroughReorderingLinks: 200 mixed create / delete / re-create /
// hibernate-flip changes made on one box fan out to two peers whose links delay every
// new connection by a random 0-1.5s, so a peer gets a box's changes in another order
// than they were made (the connection delays that left deleted rows alive on a peer
// before rows carried revisions). Every box's registry ends equal to the issuer's: the
// same hosts at the same revisions, no zombie.
func TestReplicationConvergesThroughReorderingLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("200 changes through delaying links")
	}
	c := newCluster(t)
	a := c.start(false)
	b, _ := c.startBehindProxy()
	cc, _ := c.startBehindProxy()
	harness.WaitFor(t, 10*time.Second, "three live members everywhere", func() bool {
		for _, n := range []*node{a, b, cc} {
			if len(status(t, n).Mesh.Live) != 3 {
				return false
			}
		}
		return true
	})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	hosts := make([]string, 10)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("c%d.%s", i, meshDomain)
	}
	exists := map[string]bool{}
	live := map[string]bool{}
	ops := map[string]int{}
	for range 200 {
		h := hosts[rng.IntN(len(hosts))]
		switch {
		case !exists[h]:
			a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": h, "kind": "demo"}, http.StatusCreated, nil)
			exists[h], live[h] = true, false
			ops["create"]++
		case rng.IntN(2) == 0:
			a.AdminJSON("DELETE", "/lchat/routes/"+h, nil, http.StatusOK, nil)
			exists[h] = false
			ops["delete"]++
		default:
			body := map[string]any{"hibernate": true}
			if !live[h] {
				body = map[string]any{"hibernate": false, "upstream": "127.0.0.1:9"}
			}
			a.AdminJSON("POST", "/lchat/routes/"+h+"/hibernate", body, http.StatusOK, nil)
			live[h] = !live[h]
			ops["hibernate-flip"]++
		}
	}
	t.Logf("changes on the issuer: %v", ops)
	want := routeRevs(t, a)
	describe := func(n *node) string {
		got := routeRevs(t, n)
		var diffs []string
		for _, h := range hosts {
			if got[h] != want[h] {
				diffs = append(diffs, fmt.Sprintf("%s: %q, issuer %q", h, got[h], want[h]))
			}
		}
		sort.Strings(diffs)
		return strings.Join(diffs, "; ")
	}
	d := harness.WaitFor(t, 60*time.Second, "every peer's registry equal to the issuer's", func() bool {
		return describe(b) == "" && describe(cc) == ""
	}, func() string { return "b: " + describe(b) + " | c: " + describe(cc) })
	t.Logf("FIGURE 200 changes through 0-1.5s reordering links: peers equal to the issuer %v after the last change", d)
	// Late deliveries still in flight must not undo it: look again after the longest delay.
	time.Sleep(3 * time.Second)
	for name, n := range map[string]*node{"b": b, "c": cc} {
		if diff := describe(n); diff != "" {
			t.Errorf("peer %s diverged after late deliveries: %s", name, diff)
		}
		zombies := 0
		got := routeRevs(t, n)
		for h := range got {
			if _, ok := want[h]; !ok {
				zombies++
			}
		}
		if zombies > 0 {
			t.Errorf("peer %s: %d zombie rows", name, zombies)
		}
	}
}

// TestPeerCatchesUpAfterDowntime: changes made while a peer was down (a deploy's
// restart) reach it when it comes back, without a later write or an operator's
// mesh-seed: a delete, a create, a re-create and a hibernate flip made on a while b was
// stopped are all on b, at a's revisions, a few seconds after b starts again.
func TestPeerCatchesUpAfterDowntime(t *testing.T) {
	c := newCluster(t)
	a := c.start(false)
	b := c.start(false)
	both := func() bool { return len(status(t, a).Mesh.Live) == 2 && len(status(t, b).Mesh.Live) == 2 }
	harness.WaitFor(t, 10*time.Second, "two live members everywhere", both)
	h := func(s string) string { return s + "." + meshDomain }
	for _, host := range []string{h("deleted"), h("recreated"), h("flipped")} {
		a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, http.StatusCreated, nil)
	}
	harness.WaitFor(t, 10*time.Second, "b has a's rows", func() bool {
		return fmt.Sprint(routeRevs(t, a)) == fmt.Sprint(routeRevs(t, b))
	})
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	a.AdminJSON("DELETE", "/lchat/routes/"+h("deleted"), nil, http.StatusOK, nil)
	a.AdminJSON("DELETE", "/lchat/routes/"+h("recreated"), nil, http.StatusOK, nil)
	a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": h("recreated"), "kind": "demo"}, http.StatusCreated, nil)
	a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": h("created"), "kind": "demo"}, http.StatusCreated, nil)
	a.AdminJSON("POST", "/lchat/routes/"+h("flipped")+"/hibernate", map[string]any{"hibernate": false, "upstream": "127.0.0.1:9"}, http.StatusOK, nil)
	b.Start()
	want := routeRevs(t, a)
	d := harness.WaitFor(t, 20*time.Second, "b's registry equal to a's after its restart", func() bool {
		return fmt.Sprint(routeRevs(t, b)) == fmt.Sprint(want)
	}, func() string { return fmt.Sprintf("a %v, b %v", want, routeRevs(t, b)) })
	t.Logf("FIGURE a peer restarted after 4 changes it missed: equal to the issuer %v after it started", d)
}
