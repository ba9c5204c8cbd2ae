package meshe2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestUpgradeForwardedTwiceIsHeldByTheEntry: a client's WebSocket that reaches the room
// in two hops (the entry box a, which knows no holder, to the owner b, to c where the room
// is awake) is held by the box the client reached, as one hop's is. Held by the middle
// box instead, the entry box only proxied the socket: its stop then closed it with
// Caddy's 1001, not the 1012 of a held socket, and every message crossed one box more.
func TestUpgradeForwardedTwiceIsHeldByTheEntry(t *testing.T) {
	c := newCluster(t)
	c.kind = map[string]any{"env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"}}
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	// Owned by b among all three, by c while b is away: the room wakes on c then, and
	// stays there when b is back.
	host := ""
	for i := 0; host == ""; i++ {
		h := fmt.Sprintf("hops%d.%s", i, meshDomain)
		all, _ := mesh.Owner(h, members(a, b, cc), "")
		without, _ := mesh.Owner(h, members(a, cc), "")
		if all.Self == b.self && without.Self == cc.self {
			host = h
		}
	}
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
	b.Pause()
	harness.WaitFor(t, deadAfter+10*time.Second, "b counted dead", func() bool { return len(status(t, cc).Mesh.Live) == 2 })
	c.post(cc, host, "woken on c")
	b.Resume()
	harness.WaitFor(t, deadAfter+15*time.Second, "b live again", func() bool {
		return len(status(t, a).Mesh.Live) == 3 && len(status(t, b).Mesh.Live) == 3
	})
	if got := awakeOn(t, host, a, b, cc); len(got) != 1 || got[0] != cc.self {
		t.Fatalf("%s awake on %v, want %s", host, got, cc.self)
	}

	tab := dialHeld(t, c, a, host, "/api/ws?after=0")
	if m := tab.next(t, 10*time.Second, "the backlog"); !strings.Contains(m, "woken on c") {
		t.Fatalf("first message %q, want the backlog", m)
	}
	if got := counter(t, a, "conns_open"); got != 1 {
		t.Errorf("the entry box a holds %d WebSockets, want the client's 1 (b holds %d, c %d)", got,
			counter(t, b, "conns_open"), counter(t, cc, "conns_open"))
	}
	if got := counter(t, b, "conns_open"); got != 0 {
		t.Errorf("the owner b, a hop on the way, holds %d WebSockets", got)
	}
	c.post(b, host, "after the tab")
	tab.until(t, 10*time.Second, "after the tab")
}
