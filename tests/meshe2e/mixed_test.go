package meshe2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// The mixed fleet's two domains (besides meshDomain, which the other tests use).
const (
	xDomain = "x.test"
	yDomain = "y.test"
)

// TestMixedDomainsPlaceOnBoxesWithTheRow: in a fleet whose boxes cover different
// LCHAT_MESH_DOMAINS (a: x.test and y.test, b: x.test, c: y.test), every host is served
// through every box that covers it with 0 × 404 and 0 × 503: placement hashes over the
// boxes that hold the host's row, never one that has no row or certificate for it. Hosts
// are picked so that hashing over the whole fleet would place some x.test host on c and
// some y.test host on b (what the code before this rule did: 404 from the box without
// the row).
func TestMixedDomainsPlaceOnBoxesWithTheRow(t *testing.T) {
	c := newCluster(t)
	domains := []string{xDomain + "," + yDomain, xDomain, yDomain}
	for _, d := range domains {
		c.env = []string{mesh.EnvDomains + "=" + d}
		c.start(false)
	}
	a, b, cc := c.nodes[0], c.nodes[1], c.nodes[2]
	covering := map[string][]*node{xDomain: {a, b}, yDomain: {a, cc}}
	harness.WaitFor(t, 30*time.Second, "every box sees three live boxes", func() bool {
		for _, n := range c.nodes {
			if st, ok := tryStatus(n); !ok || st.Mesh == nil || len(st.Mesh.Live) != 3 {
				return false
			}
		}
		return true
	})
	// Hosts of each domain; the first ones would be misplaced by a hash over all three.
	all := members(a, b, cc)
	wrong := map[string]*node{xDomain: cc, yDomain: b}
	var hosts []string
	domainOf := map[string]string{}
	for _, d := range []string{xDomain, yDomain} {
		var trap, rest []string
		for i := 0; len(trap) < 2 || len(rest) < 2; i++ {
			h := fmt.Sprintf("m%d.%s", i, d)
			if o, _ := mesh.Owner(h, all, ""); o.Self == wrong[d].self {
				if len(trap) < 2 {
					trap = append(trap, h)
				}
			} else if len(rest) < 2 {
				rest = append(rest, h)
			}
		}
		for _, h := range append(trap, rest...) {
			hosts = append(hosts, h)
			domainOf[h] = d
		}
	}
	for i, h := range hosts {
		via := covering[domainOf[h]][i%2]
		c.createSpace(via, h)
	}
	harness.WaitFor(t, 30*time.Second, "every covering box has every row", func() bool {
		for _, h := range hosts {
			for _, n := range covering[domainOf[h]] {
				if !hasRoute(n, h) {
					return false
				}
			}
		}
		return true
	})
	// Rounds of requests for every host through every box that covers it, the first
	// round all at once (every space wakes through two boxes together).
	var mu sync.Mutex
	codes := map[int]int{}
	var bad []string
	for round := range 3 {
		var wg sync.WaitGroup
		for _, h := range hosts {
			for _, n := range covering[domainOf[h]] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					code, body, err := c.do(n, "POST", h, "/api/messages", fmt.Sprintf(`{"author":"t","text":"r%d"}`, round), nil)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						bad = append(bad, fmt.Sprintf("%s via %s: %v", h, n.self, err))
						return
					}
					codes[code]++
					if code != http.StatusCreated {
						bad = append(bad, fmt.Sprintf("%s via %s: %d %.200s", h, n.self, code, body))
					}
				}()
			}
		}
		wg.Wait()
	}
	t.Logf("FIGURE mixed domains: %d hosts, answers %v", len(hosts), codes)
	if len(bad) > 0 {
		t.Fatalf("%d of %d requests were not served:\n%v", len(bad), 3*2*len(hosts), bad)
	}
	// And each space is awake on a box that covers its host.
	for _, h := range hosts {
		on := awakeOn(t, h, a, b, cc)
		if len(on) != 1 || on[0] == wrong[domainOf[h]].self {
			t.Errorf("%s awake on %v, want one box covering %s", h, on, domainOf[h])
		}
	}
}
