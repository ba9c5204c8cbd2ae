package chaos

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"
)

// nemesis carries out the campaign's faults and records them in the history.
type nemesis struct {
	t      *testing.T
	c      *cluster
	h      *history
	hosts  []string
	kinds  map[string]string // host -> its kind, which a re-create keeps
	paused *sync.Map         // hosts the clients leave alone

	mu       sync.Mutex
	counts   map[string]int // faults by kind
	outcomes map[string]int // what some faults ended in (relocated, refused)
}

// run carries out one fault of kind on n, healing it before it returns. overlapping: it
// runs beside another fault (which shares the history's fault list).
func (nm *nemesis) run(kind string, n *node, rng *rand.Rand, overlapping bool) {
	t, c, hosts := nm.t, nm.c, nm.hosts
	f := fault{kind: kind, box: n.i, start: time.Now()}
	switch kind {
	case "sigkill", "sigstop", "sigterm", "cut", "blackhole", "latency", "droplost", "partition":
		n.impaired.Add(1)
		defer n.impaired.Add(1)
	}
	switch kind {
	case "sigkill":
		f.hard = true
		n.Kill()
		// Nothing listens at its SELF any more: its peers' dials are refused, as they
		// would be by its machine (what tells a standby its holder's process is gone).
		n.peer.SetClosed(true)
		time.Sleep(time.Duration(1+rng.IntN(4)) * time.Second)
		nm.reopen(n)
		n.Start()
	case "sigstop":
		f.hard = true
		n.mu.Lock()
		n.stopped = true
		n.mu.Unlock()
		n.Pause()
		time.Sleep(deadAfter + time.Duration(1+rng.IntN(3))*time.Second)
		n.Resume()
		n.mu.Lock()
		n.stopped = false
		n.mu.Unlock()
	case "sigterm":
		if err := n.Stop(); err != nil {
			t.Errorf("box %d: SIGTERM drain: %v", n.i, err)
		}
		n.peer.SetClosed(true)
		time.Sleep(time.Duration(rng.IntN(3)) * time.Second)
		nm.reopen(n)
		n.Start()
	case "cut":
		f.hard = true
		n.proxy.SetDown(true)
		time.Sleep(deadAfter + time.Duration(1+rng.IntN(4))*time.Second)
		n.proxy.SetDown(false)
	case "blackhole":
		// The box's bucket traffic vanishes without an error: requests hang until
		// the box's own timeouts end them.
		f.hard = true
		n.proxy.SetBlackhole(true)
		time.Sleep(deadAfter + time.Duration(1+rng.IntN(4))*time.Second)
		n.proxy.SetBlackhole(false)
	case "partition":
		// The other boxes cannot reach this one: every connection into it through its
		// SELF (forwards, replication, a holder's stream when it is the standby, a
		// standby's watch when it is the holder) is closed as soon as it is accepted
		// (not refused: nothing says its process is gone), and the open ones cut, for
		// longer than dead_after. One way: it still reaches them, its bucket (its
		// heartbeat goes on, so the lease says it lives) and its clients. A standby must
		// not take its spaces over; its holders must stream elsewhere or wait for the
		// bucket.
		n.peer.SetDown(true)
		time.Sleep(deadAfter + time.Duration(1+rng.IntN(4))*time.Second)
		n.peer.SetDown(false)
	case "latency":
		// 2 s more on every new connection to the store (the store's
		// connections are reused, so most requests are not slowed).
		n.proxy.SetDelay(2 * time.Second)
		time.Sleep(time.Duration(3+rng.IntN(4)) * time.Second)
		n.proxy.SetDelay(0)
	case "droplost":
		// The next answers from the store to this box are lost after the store
		// acted on the request: a committed write whose response never arrives.
		n.proxy.DropResponses(1 + rng.IntN(3))
		time.Sleep(3 * time.Second)
		n.proxy.DropResponses(0)
	case "recreate":
		// Remove a space (it saves first) while requests run, then create it again
		// through another box: its bucket data is kept, so every write acknowledged
		// before stays.
		nm.recreate(n, hosts[rng.IntN(len(hosts))], c.nodes[rng.IntN(len(c.nodes))], time.Duration(rng.IntN(2000))*time.Millisecond)
	case "repldelay":
		// Everything other boxes send to this one (forwards, replicated rows and
		// tombstones) is delayed by up to 1.5 s per chunk, so it arrives late and out
		// of order, while a space is removed and re-created and another's home moves.
		n.peer.SetJitter(1500 * time.Millisecond)
		from := c.nodes[(n.i+1+rng.IntN(len(c.nodes)-1))%len(c.nodes)]
		nm.recreate(from, hosts[rng.IntN(len(hosts))], from, time.Duration(rng.IntN(500))*time.Millisecond)
		nm.relocate(from, hosts[rng.IntN(len(hosts))], false)
		time.Sleep(time.Duration(1+rng.IntN(3)) * time.Second)
		n.peer.SetJitter(0)
	case "relocate":
		// Move a space's home to the other region: its clients leave it alone until it
		// sleeps everywhere, then come back as the relocation starts, so the relocation
		// races new wakes (it is refused if a wake wins: nothing may change then).
		nm.relocate(n, hosts[rng.IntN(len(hosts))], true)
	case "reload":
		if err := n.Reload(c.boxConfig(n), true); err != nil {
			t.Errorf("box %d: reload: %v", n.i, err)
		}
		time.Sleep(time.Second)
	default:
		t.Errorf("unknown fault %q (LCHAT_CHAOS_FAULTS?)", kind)
	}
	f.heal = time.Now()
	nm.mu.Lock()
	nm.counts[kind]++
	nm.mu.Unlock()
	nm.h.mu.Lock()
	nm.h.faults = append(nm.h.faults, f)
	nm.h.mu.Unlock()
}

// reopen listens at n's SELF again, before n starts.
func (nm *nemesis) reopen(n *node) {
	if err := n.peer.SetClosed(false); err != nil {
		nm.t.Errorf("box %d: %v", n.i, err)
	}
}

func (nm *nemesis) recreate(n *node, host string, other *node, pause time.Duration) {
	if code, body, err := n.adminDo("DELETE", "/lchat/routes/"+host, nil); err != nil || code != http.StatusOK {
		// Another fault may have stopped the box (two at once): not the box's fault. But a
		// box that answered may have removed the route all the same (a 500 that says its
		// space could not be saved first, the box cut from the bucket): then it is created
		// again, as after a clean removal, or the space would end the run deleted.
		nm.logf("box %d: remove %s: %d %s %v", n.i, host, code, body, err)
		if err != nil {
			return
		}
		if got, _, gerr := n.adminDo("GET", "/lchat/routes/"+host, nil); gerr != nil || got != http.StatusNotFound {
			return
		}
	}
	time.Sleep(pause)
	for range 30 {
		code, body, err := other.adminDo("POST", "/lchat/routes", map[string]any{"host": host, "kind": nm.kinds[host]})
		if err == nil && code == http.StatusCreated {
			return
		}
		// 409 from a box the delete has not reached yet, or a box down (two faults at
		// once): try again, unless a fault beside this one created the host again
		// (the box that removed it sees it).
		nm.logf("box %d: re-create %s: %d %s %v", other.i, host, code, body, err)
		var cur struct {
			Host string `json:"host"`
		}
		if code == http.StatusConflict && n.adminGet("/lchat/routes/"+host, &cur) == nil && cur.Host == host {
			return
		}
		time.Sleep(time.Second)
	}
	nm.t.Errorf("%s could not be created again after its removal", host)
}

// relocate moves host's home region to the other one, through n. quiet: first let the
// space fall asleep (its clients pause), then let them back in as the relocation runs.
func (nm *nemesis) relocate(n *node, host string, quiet bool) {
	if quiet {
		nm.paused.Store(host, struct{}{})
		deadline := time.Now().Add(idleTimeout + 10*time.Second)
		for time.Now().Before(deadline) && nm.awakeAnywhere(host) {
			time.Sleep(200 * time.Millisecond)
		}
		nm.paused.Delete(host)
	}
	var cur struct {
		HomeRegion string `json:"home_region"`
	}
	if err := n.adminGet("/lchat/routes/"+host, &cur); err != nil {
		nm.logf("box %d: reading %s before relocating: %v", n.i, host, err)
		return
	}
	to := regions[0]
	if cur.HomeRegion == regions[0] {
		to = regions[1]
	}
	before := n.impaired.Load()
	code, body, err := n.adminDo("POST", "/lchat/mesh/relocate/"+host, map[string]any{"to": to})
	after := n.impaired.Load()
	switch {
	case err == nil && code == http.StatusOK:
		nm.count("relocated")
	case err == nil && code == http.StatusConflict:
		// Awake (a wake won the race), or no live box of the region: refused, and
		// nothing changed.
		nm.count("relocate refused (409)")
	case before%2 == 1 || after != before:
		// Another fault had the box or its bucket away during the call (a
		// repldelay's relocation goes through a box the fault beside it is on): a
		// failure is that fault's doing. What the relocation changed, if anything,
		// the history and the final agreement check.
		nm.count("relocate failed, box impaired")
		nm.logf("box %d (impaired): relocate %s to %s: %d %s %v", n.i, host, to, code, body, err)
	default:
		nm.t.Errorf("box %d: relocate %s to %s: %d %s %v", n.i, host, to, code, body, err)
	}
}

// awakeAnywhere reports whether any box that answers says host is awake or waking.
func (nm *nemesis) awakeAnywhere(host string) bool {
	for _, n := range nm.c.nodes {
		var st boxStatus
		if n.adminGet("/lchat/status", &st) != nil {
			continue
		}
		for _, s := range st.Spaces {
			if s.Host == host && (s.State == "awake" || s.State == "waking") {
				return true
			}
		}
	}
	return false
}

func (nm *nemesis) count(what string) {
	nm.mu.Lock()
	nm.outcomes[what]++
	nm.mu.Unlock()
}

func (nm *nemesis) logf(format string, args ...any) {
	nm.t.Logf("nemesis: %s", fmt.Sprintf(format, args...))
}
