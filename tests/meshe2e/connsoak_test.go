package meshe2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestHeldMessagesAppliedOnceAcrossKillAndDrain: clients on one box send messages on held
// WebSockets without pause while the space they go to is killed with its box (kill -9),
// moved by a sleep, and drained with its box; the instance (ledgerapp) applies a message
// at most once by its sequence number and keeps what it applied in its data directory.
// At the end every message is in the space's ledger exactly once: 0 lost, 0 applied twice,
// and no client's socket closed. LCHAT_MESH_CONN_ROUNDS repeats the kill, sleep and drain
// (the boxes restarted between rounds); LCHAT_MESH_CONN_MESSAGES sets each client's count.
func TestHeldMessagesAppliedOnceAcrossKillAndDrain(t *testing.T) {
	rounds := envInt("LCHAT_MESH_CONN_ROUNDS", 1)
	perPhase := envInt("LCHAT_MESH_CONN_MESSAGES", 15)
	const clients = 4
	app := filepath.Join(t.TempDir(), "ledgerapp")
	if out, err := exec.Command("go", "build", "-o", app, "./ledgerapp").CombinedOutput(); err != nil {
		t.Fatalf("building ledgerapp: %v\n%s", err, out)
	}
	c := newCluster(t)
	c.kind = map[string]any{"command": app, "args": []string{}, "ready_path": "/healthz", "isolation": "none",
		"network": "host", "idle_timeout": "2s", "replication": map[string]any{"class": "periodic", "interval": "1s"}}
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	// Owned by b; with b gone, by cc; with both gone, a: each phase moves the space.
	host := hostMoving(t, "ledger", a, b, cc)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })

	// Each client sends "c<k>-<i>" and waits for its "ok" before the next; an ok may come
	// twice (a message applied by an instance whose box died before its checkpoint is
	// applied again by the next), which the ledger check below counts.
	var sent atomic.Int64
	total := rounds * 4 * perPhase
	// gates[k] holds client k's leave to send: one token per message, perPhase of them
	// given at each phase; a client without one waits.
	gates := make([]chan struct{}, clients)
	for k := range gates {
		gates[k] = make(chan struct{}, total)
	}
	cls := make([]*heldClient, clients)
	for k := range cls {
		cls[k] = dialHeld(t, c, a, host, "/ws")
		cls[k].next(t, 20*time.Second, "the welcome")
	}
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for k, cl := range cls {
		wg.Go(func() {
			oks := map[string]bool{}
			for i := range total {
				select {
				case <-gates[k]:
				case <-t.Context().Done():
					return
				}
				msg := fmt.Sprintf("c%d-%d", k, i)
				if err := cl.ws.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
					errs <- fmt.Errorf("client %d sending %s: %v", k, msg, err)
					return
				}
				deadline := time.After(90 * time.Second)
				for !oks[msg] {
					select {
					case m := <-cl.msgs:
						oks[strings.TrimPrefix(m, "ok ")] = true
					case err := <-cl.done:
						errs <- fmt.Errorf("client %d: the socket ended after %d messages: %v", k, i, err)
						return
					case <-deadline:
						errs <- fmt.Errorf("client %d: no answer to %s in 90s", k, msg)
						return
					}
				}
				sent.Add(1)
			}
		})
	}
	// phaseDone lets each client send perPhase more messages and waits for their answers.
	step := int64(0)
	phaseDone := func(what string) {
		t.Helper()
		step++
		for _, g := range gates {
			for range perPhase {
				g <- struct{}{}
			}
		}
		n := step * int64(perPhase) * clients
		harness.WaitFor(t, 3*time.Minute, what, func() bool {
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			return sent.Load() >= n
		}, func() string { return fmt.Sprintf("(%d answered)", sent.Load()) })
	}
	// Between phases the clients wait: the space sleeps its idle timeout.
	untilAsleep := func() {
		t.Helper()
		var up []*node
		for _, n := range []*node{a, b, cc} {
			if !n.Exited() {
				up = append(up, n)
			}
		}
		harness.WaitFor(t, 30*time.Second, "the space asleep", func() bool { return len(awakeOn(t, host, up...)) == 0 })
	}
	onlyOn := func(want *node, what string) {
		t.Helper()
		var up []*node
		for _, n := range []*node{a, b, cc} {
			if !n.Exited() {
				up = append(up, n)
			}
		}
		if got := awakeOn(t, host, up...); len(got) != 1 || got[0] != want.self {
			t.Fatalf("%s: %s awake on %v, want %s", what, host, got, want.self)
		}
	}
	for r := range rounds {
		if r > 0 {
			b.Start()
			cc.Start()
			harness.WaitFor(t, 30*time.Second, "three live members again", func() bool { return len(status(t, a).Mesh.Live) == 3 })
			untilAsleep() // the next message wakes it on its owner, b
		}
		phaseDone("the messages to b")
		onlyOn(b, "before the kill")
		b.Kill()
		phaseDone("the messages after b's kill")
		untilAsleep() // the next message wakes it on cc, the owner without b
		phaseDone("the messages to cc")
		if got := awakeOn(t, host, a, cc); len(got) == 1 && got[0] == a.self {
			// A forward to cc that failed to connect (loaded machine) fell back to
			// waking it on a: this round's drain is not of the space's box.
			t.Logf("round %d: the space woke on %s, not %s (a forward fell back)", r+1, a.self, cc.self)
		} else {
			onlyOn(cc, "before the drain")
		}
		if err := cc.Stop(); err != nil {
			t.Fatalf("draining %s: %v", cc.self, err)
		}
		phaseDone("the messages after cc's drain")
		onlyOn(a, "after the drain")
		t.Logf("round %d: %d messages answered", r+1, sent.Load())
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The ledger of the space (on a, the box left running it): every message exactly once.
	ledger := c.mustDo(a, "GET", host, "/ledger", "", 200)
	count := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(ledger), "\n") {
		if f := strings.SplitN(line, " ", 3); len(f) == 3 {
			count[f[2]]++
		}
	}
	lost, twice := 0, 0
	for k := range clients {
		for i := range total {
			switch n := count[fmt.Sprintf("c%d-%d", k, i)]; {
			case n == 0:
				lost++
			case n > 1:
				twice++
			}
		}
	}
	t.Logf("FIGURE held messages across %d round(s) of kill -9, sleep and drain, %d clients: %d applied, %d lost, %d applied twice; replays %d",
		rounds, clients, len(count), lost, twice, counter(t, a, "conn_events_replayed"))
	if lost > 0 || twice > 0 {
		t.Errorf("%d messages lost, %d applied twice (of %d)", lost, twice, clients*total)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
