package meshe2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestSkewedClocksForward: two boxes whose wall clocks differ by five minutes (the
// test-only mesh option test_clock_offset on b) forward to each other: each accepts the other's marker
// (forwarded_in grows, markers_stripped stays 0), because markers are signed and checked
// against the bucket's clock; by wall clocks each would strip the other's marker as
// stale, and while their views disagreed a request could bounce between them.
func TestSkewedClocksForward(t *testing.T) {
	c := newCluster(t)
	a := c.start(false)
	c.mesh = map[string]any{"test_clock_offset": "5m"}
	b := c.start(false)
	c.mesh = nil
	if !strings.Contains(b.Logs(), "test-only clock offset in effect") {
		t.Fatal("b does not run with the clock offset: the test would show nothing")
	}
	harness.WaitFor(t, 10*time.Second, "two live members on both boxes", func() bool {
		return len(status(t, a).Mesh.Live) == 2 && len(status(t, b).Mesh.Live) == 2
	})
	for _, tc := range []struct{ via, owner *node }{{b, a}, {a, b}} {
		host := hostOwnedBy(t, "skew", tc.owner, a, b)
		c.createSpace(tc.owner, host)
		harness.WaitFor(t, 10*time.Second, "the row on both boxes", func() bool { return hasRoute(a, host) && hasRoute(b, host) })
		before := status(t, tc.owner).Mesh.Counters
		c.mustDo(tc.via, "GET", host, "/api/messages", "", http.StatusOK)
		after := status(t, tc.owner).Mesh.Counters
		if after["markers_stripped"] != before["markers_stripped"] {
			t.Errorf("%s stripped the marker of a box 5m off: markers_stripped %d -> %d", tc.owner.self, before["markers_stripped"], after["markers_stripped"])
		}
		if after["forwarded_in"] <= before["forwarded_in"] {
			t.Errorf("%s did not take the request as forwarded (forwarded_in %d -> %d)", tc.owner.self, before["forwarded_in"], after["forwarded_in"])
		}
	}
}
