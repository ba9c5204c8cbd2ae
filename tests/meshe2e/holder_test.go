package meshe2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// load sends requests for hosts through every box that is up, until stopped, and counts
// the answers by status.
type load struct {
	c     *cluster
	hosts []string
	// down marks boxes not to enter through (being restarted), by index in c.nodes.
	down sync.Map

	mu     sync.Mutex
	codes  map[int]int
	errs   int
	bad    []string // the first few 503s, with what they said
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startLoad(c *cluster, hosts []string, workers int) *load {
	l := &load{c: c, hosts: hosts, codes: map[int]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for w := range workers {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for ctx.Err() == nil {
				i := rng.IntN(len(c.nodes))
				if _, isDown := l.down.Load(i); isDown {
					continue
				}
				n, host := c.nodes[i], hosts[rng.IntN(len(hosts))]
				code, body, err := c.do(n, "GET", host, "/api/messages", "", nil)
				l.note(n, host, code, body, err)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *load) note(n *node, host string, code int, body string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs++
		return
	}
	l.codes[code]++
	if code == http.StatusServiceUnavailable && len(l.bad) < 5 {
		l.bad = append(l.bad, fmt.Sprintf("%s via %s at %s: %.200s", host, n.self, time.Now().Format("15:04:05.000"), body))
	}
}

// stop ends the load and returns the answers by status and the transport errors.
func (l *load) stop() (map[int]int, int, []string) {
	l.cancel()
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.codes, l.errs, l.bad
}

// awakeWhere maps each host to the boxes it is awake on.
func awakeWhere(t *testing.T, hosts []string, nodes ...*node) map[string][]string {
	out := map[string][]string{}
	for _, h := range hosts {
		out[h] = awakeOn(t, h, nodes...)
	}
	return out
}

// TestEveryRequestReachesTheHolder: spaces awake on boxes that are not their owners
// (after boxes join the fleet, and during a rolling restart) are reached from every box,
// with 0 × 503 while their holder is live, WebSockets included, and without a lease
// attempt (bucket requests) per request once the holder is known.
func TestEveryRequestReachesTheHolder(t *testing.T) {
	c := newCluster(t)
	a := c.start(false)
	// Every space wakes on a, the only box; the boxes that join later own most of them.
	// Each host's owner among 3 boxes is a with probability 1/3, so with 6 spaces all six
	// stayed a's 1 time in 729 and the check below found nothing to prove (CI saw it);
	// with 16, 1 time in 43 million.
	var hosts []string
	for i := range 16 {
		h := fmt.Sprintf("held%d.%s", i, meshDomain)
		c.createSpace(a, h)
		c.mustDo(a, "GET", h, "/api/messages", "", 200)
		hosts = append(hosts, h)
	}

	check := func(t *testing.T, size int) {
		nodes := c.nodes[:size]
		harness.WaitFor(t, 10*time.Second, fmt.Sprintf("every box to see %d live boxes", size), func() bool {
			for _, n := range nodes {
				st, ok := tryStatus(n)
				if !ok || len(st.Mesh.Live) != size {
					return false
				}
			}
			return true
		})
		// Which spaces are awake on a box other than their owner, and which box is
		// neither: a request entering there goes to the owner, which is not the holder.
		misplaced := 0
		for h, on := range awakeWhere(t, hosts, nodes...) {
			owner, _ := mesh.Owner(h, members(nodes...), "")
			if len(on) == 1 && on[0] != owner.Self {
				misplaced++
			}
		}
		if misplaced == 0 {
			t.Fatalf("no space is awake on a non-owner among %d boxes: the test proves nothing", size)
		}
		t.Logf("%d boxes: %d of %d spaces awake on a box that is not their owner", size, misplaced, len(hosts))

		l := startLoad(c, hosts, 4)
		time.Sleep(3 * time.Second)
		// Once the holders are known, requests cost no wake attempts (lease requests to
		// the bucket): count lease conflicts across the fleet over a second window.
		conflicts := func() (n uint64) {
			for _, b := range nodes {
				n += status(t, b).Mesh.Counters["lease_conflicts"]
			}
			return n
		}
		before := conflicts()
		time.Sleep(2 * time.Second)
		after := conflicts()
		codes, errs, bad := l.stop()
		t.Logf("FIGURE %d boxes, spaces awake on non-owners: answers %v, transport errors %d, lease conflicts in the last 2s %d",
			size, codes, errs, after-before)
		if codes[http.StatusServiceUnavailable] != 0 || errs != 0 {
			t.Errorf("%d × 503 and %d transport errors with every holder live: %v", codes[http.StatusServiceUnavailable], errs, bad)
		}
		if codes[200] == 0 {
			t.Errorf("no request answered: %v", codes)
		}
		if after-before > 2 {
			t.Errorf("%d lease conflicts in 2s of steady load: a wake attempt (bucket requests) per request", after-before)
		}
		// No space moved: each is still awake on exactly one box.
		for h, on := range awakeWhere(t, hosts, nodes...) {
			if len(on) != 1 {
				t.Errorf("%s awake on %v, want exactly one box", h, on)
			}
		}
		// A WebSocket to a space awake on a non-owner, entering through a box that is
		// neither, gets the messages posted through yet another box.
		for h, on := range awakeWhere(t, hosts, nodes...) {
			owner, _ := mesh.Owner(h, members(nodes...), "")
			if len(on) != 1 || on[0] == owner.Self {
				continue
			}
			var entry, poster *node
			for _, n := range nodes {
				switch {
				case n.self == on[0] || n.self == owner.Self:
				case entry == nil:
					entry = n
				default:
					poster = n
				}
			}
			if poster == nil {
				poster = c.nodes[slices.IndexFunc(nodes, func(n *node) bool { return n.self == owner.Self })]
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			ws, _, err := websocket.Dial(ctx, "wss://"+h+"/api/ws", &websocket.DialOptions{HTTPClient: c.client(entry)})
			if err != nil {
				cancel()
				t.Fatalf("WebSocket to %s (awake on %s, owned by %s) via %s: %v", h, on[0], owner.Self, entry.self, err)
			}
			text := fmt.Sprintf("to the holder among %d", size)
			c.post(poster, h, text)
			for {
				_, data, err := ws.Read(ctx)
				if err != nil {
					t.Fatalf("reading the WebSocket: %v", err)
				}
				if strings.Contains(string(data), text) {
					break
				}
			}
			ws.CloseNow()
			cancel()
			break
		}
	}

	// A box joins as an operator adds one: started, then seeded with a's routes.
	join := func() {
		t.Helper()
		n := c.start(false)
		if out, err := a.CLI("mesh-seed", n.self); err != nil {
			t.Fatalf("mesh-seed %s: %v\n%s", n.self, err, out)
		}
	}
	join()
	join()
	t.Run("3 boxes after a join", func(t *testing.T) { check(t, 3) })
	join()
	join()
	t.Run("5 boxes after a join", func(t *testing.T) { check(t, 5) })

	t.Run("rolling restart of 5 boxes", func(t *testing.T) {
		l := startLoad(c, hosts, 4)
		var restarts atomic.Int32
		for i, n := range c.nodes {
			l.down.Store(i, true)
			start := time.Now()
			if err := n.Stop(); err != nil {
				t.Logf("%s exit: %v", n.self, err)
			}
			n.Start()
			l.down.Delete(i)
			restarts.Add(1)
			t.Logf("restarted %s in %v", n.self, time.Since(start).Round(time.Millisecond))
			// Let the restarted box join everyone's view before the next one goes.
			harness.WaitFor(t, 10*time.Second, "every box to see 5 live boxes", func() bool {
				for _, b := range c.nodes {
					st, ok := tryStatus(b)
					if !ok || len(st.Mesh.Live) != len(c.nodes) {
						return false
					}
				}
				return true
			})
		}
		codes, errs, bad := l.stop()
		t.Logf("FIGURE rolling restart of %d boxes under load: answers %v, transport errors %d", restarts.Load(), codes, errs)
		if codes[http.StatusServiceUnavailable] != 0 {
			t.Errorf("%d × 503 during the rolling restart: %v", codes[http.StatusServiceUnavailable], bad)
			for _, n := range c.nodes {
				for _, line := range strings.Split(n.Logs(), "\n") {
					if strings.Contains(line, `"status":503`) || strings.Contains(line, "gave up waiting") || strings.Contains(line, "no forward left") {
						t.Logf("%s: %.400s", n.self, line)
					}
				}
			}
		}
		for h, on := range awakeWhere(t, hosts, c.nodes...) {
			if len(on) > 1 {
				t.Errorf("%s awake on %v after the restarts", h, on)
			}
		}
	})
}
