package meshe2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// standbyOf is the stream part of a space's log status on n (engine.StandbyStatus).
func standbyOf(t *testing.T, n *node, host string) (s struct {
	Box       string `json:"box"`
	NoStandby string `json:"no_standby"`
	Streamed  uint64 `json:"streamed"`
}) {
	t.Helper()
	var st boxStatus
	if err := json.Unmarshal([]byte(c0Status(t, n)), &st); err != nil {
		t.Fatal(err)
	}
	var log struct {
		Standby json.RawMessage `json:"standby"`
	}
	if raw := st.logOf(host); raw != "" {
		json.Unmarshal([]byte(raw), &log)
	}
	if len(log.Standby) > 0 {
		json.Unmarshal(log.Standby, &s)
	}
	return s
}

// standbyRow is one stream a box's spool keeps, as its mesh status's standby_for lists it.
type standbyRow struct {
	Host     string `json:"host"`
	Holder   string `json:"holder"`
	Gen      int64  `json:"gen"`
	LastSeq  int64  `json:"last_seq"`
	Watching bool   `json:"watching"`
	Sealed   bool   `json:"sealed"`
	Warm     bool   `json:"warm"`
}

// standbyFor is n's mesh status's standby_for: the streams its spool keeps.
func standbyFor(t *testing.T, n *node) []standbyRow {
	t.Helper()
	var st struct {
		Mesh struct {
			StandbyFor []standbyRow `json:"standby_for"`
		} `json:"mesh"`
	}
	if err := json.Unmarshal([]byte(c0Status(t, n)), &st); err != nil {
		t.Fatal(err)
	}
	return st.Mesh.StandbyFor
}

// takeovers is n's mesh status's recent takeovers, newest first.
func takeovers(t *testing.T, n *node) []struct {
	Host   string `json:"host"`
	Holder string `json:"holder"`
	Warm   bool   `json:"warm"`
	Err    string `json:"error"`
} {
	t.Helper()
	var st struct {
		Mesh struct {
			Totals struct {
				Recent []struct {
					Host   string `json:"host"`
					Holder string `json:"holder"`
					Warm   bool   `json:"warm"`
					Err    string `json:"error"`
				} `json:"recent_takeovers"`
			} `json:"standby_totals"`
		} `json:"mesh"`
	}
	if err := json.Unmarshal([]byte(c0Status(t, n)), &st); err != nil {
		t.Fatal(err)
	}
	return st.Mesh.Totals.Recent
}

func c0Status(t *testing.T, n *node) string {
	t.Helper()
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(n.AdminURL + "/lchat/status")
	if err != nil {
		t.Fatalf("%s's /lchat/status: %v", n.self, err)
	}
	defer resp.Body.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// standbyPair starts two boxes (mesh settings mesh, nil for the cluster's), the second with
// its bucket link through a proxy when proxied, and a demo room of a standby kind awake on
// the second (its holder; the first is its standby), with n messages posted through the
// first, each answered 201 (returned).
func standbyPair(t *testing.T, tag string, mesh map[string]any, proxied bool, n int) (c *cluster, a, b *node, host string, acked []string) {
	t.Helper()
	c = newCluster(t)
	if mesh != nil {
		c.mesh = mesh
	}
	a, b, host, acked = standbyPairOn(t, c, tag, proxied, n)
	return c, a, b, host, acked
}

// standbyPairOn is standbyPair on the cluster c, set up as the test needs (a kind it set
// stays).
func standbyPairOn(t *testing.T, c *cluster, tag string, proxied bool, n int) (a, b *node, host string, acked []string) {
	t.Helper()
	if c.kind == nil {
		c.kind = logOnlyKind(map[string]any{"durability": "standby"})
	}
	a, b = c.start(false), c.start(proxied)
	harness.WaitFor(t, 15*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	host = hostOwnedBy(t, tag, b, a, b)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on the holder", func() bool { return hasRoute(b, host) })
	for i := range n {
		text := fmt.Sprintf("m-%d", i)
		c.post(a, host, text)
		acked = append(acked, text)
	}
	if got := awakeOn(t, host, a, b); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}
	return a, b, host, acked
}

// watching waits until n shows that it keeps host's stream and watches its holder.
func watching(t *testing.T, n *node, host string) {
	t.Helper()
	harness.WaitFor(t, 5*time.Second, "the standby watching the holder", func() bool {
		for _, f := range standbyFor(t, n) {
			if f.Host == host && f.Watching {
				return true
			}
		}
		return false
	})
}

// served waits up to within for the room to be served through n and checks that every
// message of acked is in it; it returns the room's messages and how long the wait took.
func served(t *testing.T, c *cluster, n *node, host string, acked []string, within time.Duration) (map[string]int64, time.Duration) {
	t.Helper()
	start := time.Now()
	var got map[string]int64
	harness.WaitFor(t, within, "the room served through "+n.self, func() bool {
		var code int
		got, code, _ = c.roomTexts(n, host)
		return code == http.StatusOK
	})
	if lost := missing(acked, got); len(lost) > 0 {
		t.Fatalf("after the holder's loss, %d of %d writes answered 201 are gone: %v", len(lost), len(acked), lost)
	}
	return got, time.Since(start)
}

// TestStandbyAcknowledgesWithTheBucketCut: a room of a kind whose durability is standby,
// awake on a box whose standby is the other box. Its bucket link cut, the holder still
// answers writes 201 within the round trip to its standby (a bucket kind would answer
// 503: TestCutBucketRefusesWritesThenHeals); killed with -9 right after the last answer,
// the other box takes the room over from the stream it keeps, and every write answered
// 201 is there, the ones the bucket never saw included.
func TestStandbyAcknowledgesWithTheBucketCut(t *testing.T) {
	c, a, b, host, acked := standbyPair(t, "standby", nil, true, 5)
	if s := standbyOf(t, b, host); s.Box != a.self || s.Streamed == 0 {
		t.Fatalf("the holder's stream: %+v, want %s as its standby", s, a.self)
	}
	b.bucketProxy.SetDown(true)
	start := time.Now()
	for i := range 5 {
		text := fmt.Sprintf("cut-%d", i)
		c.post(a, host, text)
		acked = append(acked, text)
	}
	t.Logf("5 writes answered 201 with the holder's bucket cut, in %v", time.Since(start).Round(time.Millisecond))
	b.Kill()
	got, took := served(t, c, a, host, acked, deadAfter+30*time.Second)
	t.Logf("served again %v after the kill", took.Round(time.Millisecond))
	// The next message's id follows them: no id handed out twice.
	var maxID int64
	for _, id := range got {
		maxID = max(maxID, id)
	}
	code, body, _ := c.do(a, "POST", host, "/api/messages", `{"author":"test","text":"after"}`, nil)
	var next struct {
		ID int64 `json:"id"`
	}
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &next) != nil || next.ID <= maxID {
		t.Fatalf("the write after the takeover: %d %.200s (ids up to %d before)", code, body, maxID)
	}
}

// TestStandbyTakesOverBeforeDeadAfter: with dead_after at 30 s, a holder killed with -9
// right after its last answer is replaced by its standby's box well before its heartbeat
// could look dead: the standby's watch of the holder breaks, the holder's address refuses
// connections, and the standby takes the room over with every write answered 201. The
// standby kept the space's checkpoint warm (warm in its standby_for), so
// the takeover downloaded none (its record says warm).
func TestStandbyTakesOverBeforeDeadAfter(t *testing.T) {
	const longDeadAfter = 30 * time.Second
	c, a, b, host, acked := standbyPair(t, "early", map[string]any{"dead_after": longDeadAfter.String()}, false, 10)
	if s := standbyOf(t, b, host); s.Box != a.self {
		t.Fatalf("the holder's stream: %+v, want %s as its standby", s, a.self)
	}
	// The standby shows the stream it keeps, its watch of the holder, and its warm copy.
	watching(t, a, host)
	harness.WaitFor(t, 30*time.Second, "the standby's copy warm", func() bool {
		for _, f := range standbyFor(t, a) {
			if f.Host == host && f.Warm {
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("the standby's spool: %+v", standbyFor(t, a)) })
	b.Kill()
	_, took := served(t, c, a, host, acked, longDeadAfter/2)
	t.Logf("served again %v after the kill (dead_after %v)", took.Round(time.Millisecond), longDeadAfter)
	tk := takeovers(t, a)
	if len(tk) == 0 || tk[0].Host != host || tk[0].Err != "" || !tk[0].Warm {
		t.Fatalf("the takeover's record: %+v, want %s taken over warm (no download)", tk, host)
	}
}

// TestStandbyWaitsForAPausedHolder: a holder that is frozen (SIGSTOP), not dead, keeps
// its watch open: its standby does not take its room over early, however long the pause,
// until the holder's heartbeat dies (dead_after); then the room is served by the other box
// with every write answered 201, and the holder, resumed, finds its stream sealed.
func TestStandbyWaitsForAPausedHolder(t *testing.T) {
	const pausedDeadAfter = 8 * time.Second
	c, a, b, host, acked := standbyPair(t, "paused", map[string]any{"dead_after": pausedDeadAfter.String()}, false, 5)
	watching(t, a, host)
	b.Pause()
	paused := time.Now()
	// Well within dead_after the standby has not taken the room over: the watch did not
	// break, so nothing says the holder is gone.
	time.Sleep(pausedDeadAfter / 3)
	if status(t, a).awake(host) {
		t.Fatalf("%s took the room over %v into the holder's pause (dead_after %v)", a.self, time.Since(paused).Round(time.Millisecond), pausedDeadAfter)
	}
	// A request sent while the holder still looks live would be forwarded to it and wait
	// for its answer (a peer has minutes to send headers): ask once it is dead.
	harness.WaitFor(t, pausedDeadAfter+10*time.Second, "the paused holder dead in the standby's view", func() bool {
		return !slices.Contains(status(t, a).Mesh.Live, b.self)
	})
	served(t, c, a, host, acked, 30*time.Second)
	// The heartbeat dies dead_after after its last write, up to a beat (1 s) before the pause,
	// and the bucket's clock has whole seconds: a few seconds early is the heartbeat's rule.
	took := time.Since(paused)
	if took < pausedDeadAfter/2 {
		t.Fatalf("served by the other box %v into the pause, well before dead_after %v", took.Round(time.Millisecond), pausedDeadAfter)
	}
	b.Resume()
	for _, f := range standbyFor(t, a) {
		if f.Host == host && f.Holder == b.self && !f.Sealed {
			t.Fatalf("the paused holder's stream was not sealed by the takeover: %+v", f)
		}
	}
	t.Logf("served by the standby's box %v after the pause (dead_after %v)", took.Round(time.Millisecond), pausedDeadAfter)
}

// TestStandbyLeavesASleptSpaceAsleep: a space that slept on its holder (its lease
// released) is not taken over by its standby when the holder then dies, even if the
// standby still keeps its stream: the holder's request to drop it after the final
// checkpoint is best effort, and here it is refused (the standby is down while the space
// sleeps, and comes back with its spool). The space stays asleep until a request wakes it.
func TestStandbyLeavesASleptSpaceAsleep(t *testing.T) {
	_, a, b, host, _ := standbyPair(t, "slept", map[string]any{"dead_after": "30s"}, false, 1)
	watching(t, a, host)
	a.Kill()
	b.AdminJSON("POST", "/lchat/routes/"+host+"/sleep", nil, http.StatusOK, nil)
	a.Start()
	watching(t, a, host) // its spool kept the stream, so it watches the holder again
	b.Kill()
	// The watch breaks at once and the address refuses: were the space taken over, it
	// would be awake on a within a second or two.
	time.Sleep(3 * time.Second)
	if status(t, a).awake(host) {
		t.Fatalf("%s woke %s, which had slept on its holder, when the holder died", a.self, host)
	}
}

// TestStandbyDrainHandsTheSpaceOver: the holder of a standby space drains: the space sleeps
// there with its final checkpoint, the holder hands it to its standby, which warms that
// checkpoint (a newer generation than the copy it warmed when the stream started), and the
// next request wakes it on the standby's box with every write answered 201 and no
// checkpoint downloaded. A WebSocket and an event stream held at the standby's box get every
// message once, in order, across the handover.
func TestStandbyDrainHandsTheSpaceOver(t *testing.T) {
	c := newCluster(t)
	c.kind = logOnlyKind(map[string]any{"durability": "standby", "env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"}})
	a, b, host, acked := standbyPairOn(t, c, "handover", false, 10)
	if s := standbyOf(t, b, host); s.Box != a.self {
		t.Fatalf("the holder's stream: %+v, want %s as its standby", s, a.self)
	}
	held := holdRoom(t, c, a, host)
	held.until(t, acked[len(acked)-1])
	spaceOn := func(n *node) (warm int64, kept bool) {
		for _, sp := range status(t, n).Spaces {
			if sp.Host == host {
				if sp.WarmGeneration != nil {
					warm = *sp.WarmGeneration
				} else {
					warm = -1
				}
				return warm, sp.KeptDataDir
			}
		}
		return -1, false
	}
	var before int64
	harness.WaitFor(t, 30*time.Second, "the stream's checkpoint warm on the standby", func() bool {
		before, _ = spaceOn(a)
		return before >= 0
	}, func() string { return c0Status(t, a) })
	if err := b.Stop(); err != nil {
		t.Fatalf("draining the holder: %v", err)
	}
	harness.WaitFor(t, 30*time.Second, "the drain's checkpoint warm on the standby", func() bool {
		warm, _ := spaceOn(a)
		return warm > before
	}, func() string { return c0Status(t, a) })
	served(t, c, a, host, acked, 30*time.Second)
	if _, kept := spaceOn(a); !kept {
		t.Fatalf("the wake after the handover downloaded the checkpoint: %s", c0Status(t, a))
	}
	c.post(a, host, "after the drain")
	held.until(t, "after the drain")
	room, _, _ := c.roomTexts(a, host)
	held.check(t, room)
}

// TestStandbyKilledWhileWritesFlow: three boxes, writes to a room of a standby kind flowing
// through the box that is neither its holder nor its standby. The standby is killed with -9
// between two writes: the holder goes on answering 201 (on bucket proofs until a new stream
// has a live standby), never on its own disk alone, so when the holder is killed too every
// write answered 201, before and after the standby's death, is in the room once it is served
// through the last box.
func TestStandbyKilledWhileWritesFlow(t *testing.T) {
	c := newCluster(t)
	c.kind = logOnlyKind(map[string]any{"durability": "standby", "env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"}})
	nodes := []*node{c.start(false), c.start(false), c.start(false)}
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, nodes[0]).Mesh.Live) == 3 })
	holder := nodes[0]
	host := hostOwnedBy(t, "sbkill", holder, nodes...)
	c.createSpace(nodes[1], host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool {
		return hasRoute(nodes[1], host) && hasRoute(nodes[2], host) && hasRoute(holder, host)
	})
	var acked []string
	post := func(via *node, must bool) {
		t.Helper()
		text := fmt.Sprintf("m-%d", len(acked))
		code, body, err := c.do(via, "POST", host, "/api/messages", fmt.Sprintf(`{"author":"test","text":%q}`, text), nil)
		switch {
		case code == http.StatusCreated:
			acked = append(acked, text)
		case must:
			t.Fatalf("post %s through %s: %d %v %.200s", text, via.self, code, err, body)
		default:
			t.Logf("post %s through %s: %d %v (not acknowledged)", text, via.self, code, err)
		}
	}
	// The first write wakes the room on its owner; the holder's stream then names the standby.
	post(nodes[1], true)
	if got := awakeOn(t, host, nodes...); len(got) != 1 || got[0] != holder.self {
		t.Fatalf("%s awake on %v, want %s", host, got, holder.self)
	}
	var standby, entry *node
	harness.WaitFor(t, 10*time.Second, "the holder's stream to a standby", func() bool {
		post(nodes[1], true)
		s := standbyOf(t, holder, host)
		for _, n := range nodes[1:] {
			if n.self == s.Box && s.Streamed > 0 {
				standby = n
			} else {
				entry = n
			}
		}
		return standby != nil
	})
	held := holdRoom(t, c, entry, host)
	for range 10 {
		post(entry, true)
	}
	held.until(t, acked[len(acked)-1])
	standby.Kill()
	before := len(acked)
	for range 30 {
		post(entry, false)
	}
	if after := len(acked) - before; after < 25 {
		t.Fatalf("with its standby dead the holder answered %d of 30 writes 201, want it to go on", after)
	}
	held.until(t, acked[len(acked)-1])
	holder.Kill()
	room, took := served(t, c, entry, host, acked, 30*time.Second)
	t.Logf("%d writes answered 201 (%d after the standby's death), all there %v after the holder's death",
		len(acked), len(acked)-before, took.Round(time.Millisecond))
	post(entry, true) // served by the last box: the held clients get it from there
	held.until(t, acked[len(acked)-1])
	room, _, _ = c.roomTexts(entry, host)
	held.check(t, room)
}

// TestStandbyPartitionedFromItsHolder: the holder and its standby cannot reach each other
// (every packet between them dropped, both ways), while each still beats through the bucket
// and answers its clients. The holder gives its standby up (within the 2 s a segment may
// take) and acknowledges on bucket proofs; the standby, whose watch of the holder hangs,
// does not take the room over while the holder's heartbeat says it lives (twice dead_after);
// with the holder's bucket cut as well, a write is refused, never answered 201. A WebSocket
// and an event stream held at the holder get every message once, in order, through the
// partition: the room's sends leave the cut-off box out after its first timeout
// (held/peerskip.go) rather than wait for it at each. Healed, and the holder killed
// with -9: every write answered 201 is served by the standby's box.
func TestStandbyPartitionedFromItsHolder(t *testing.T) {
	c := newCluster(t)
	c.peered = true
	c.kind = logOnlyKind(map[string]any{"durability": "standby", "env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"}})
	a, b, host, acked := standbyPairOn(t, c, "parted", true, 5)
	if s := standbyOf(t, b, host); s.Box != a.self || s.Streamed == 0 {
		t.Fatalf("the holder's stream: %+v, want %s as its standby", s, a.self)
	}
	watching(t, a, host)
	held := holdRoom(t, c, b, host)
	held.until(t, acked[len(acked)-1])

	a.peer.SetBlackhole(true)
	b.peer.SetBlackhole(true)
	start := time.Now()
	var took []time.Duration
	for i := range 5 {
		text := fmt.Sprintf("parted-%d", i)
		t0 := time.Now()
		c.post(b, host, text) // to the holder itself: the standby cannot forward to it
		took = append(took, time.Since(t0).Round(time.Millisecond))
		acked = append(acked, text)
	}
	t.Logf("5 writes answered 201 by the holder cut off from its standby, in %v: %v", time.Since(start).Round(time.Millisecond), took)
	// The first waits out the 2 s a segment may take; the holder then asks that standby
	// again only after 5 s (doubling), so the next ones wait for the bucket, not for it. The
	// room's send to its held connections waits for the cut-off box once (3 s, a peer's
	// part), then leaves it out.
	if slow := len(slices.DeleteFunc(slices.Clone(took), func(d time.Duration) bool { return d < 2*time.Second })); slow > 2 {
		t.Fatalf("%d of 5 writes waited out the unreachable standby (%v): it is asked again at every new stream", slow, took)
	}
	if s := standbyOf(t, b, host); s.Box != "" || s.NoStandby == "" {
		t.Fatalf("the holder's stream while cut off from its standby: %+v, want it given up, with why", s)
	}
	held.until(t, acked[len(acked)-1])
	room, code, err := c.roomTexts(b, host)
	if code != http.StatusOK {
		t.Fatalf("reading the room during the partition: %d %v", code, err)
	}
	held.check(t, room)
	harness.WaitFor(t, 10*time.Second, "the holder still live to the standby", func() bool {
		return slices.Contains(status(t, a).Mesh.Live, b.self)
	})
	time.Sleep(2 * deadAfter)
	if status(t, a).awake(host) {
		t.Fatal("the standby took the room over from a holder that was alive and beating")
	}
	if !status(t, b).awake(host) {
		t.Fatal("the holder let the room go while cut off from its standby")
	}

	b.bucketProxy.SetDown(true)
	if code, _ := c.postText(b, host, "cut-off"); code == http.StatusCreated {
		t.Fatal("a write answered 201 by a holder cut off from its standby and the bucket")
	}
	b.bucketProxy.SetDown(false)
	a.peer.SetBlackhole(false)
	b.peer.SetBlackhole(false)
	harness.WaitFor(t, 15*time.Second, "a write answered 201 once healed", func() bool {
		code, _ := c.postText(b, host, "healed")
		return code == http.StatusCreated
	})
	acked = append(acked, "healed")

	b.Kill()
	_, after := served(t, c, a, host, acked, deadAfter+30*time.Second)
	t.Logf("served by the standby's box %v after the holder's kill", after.Round(time.Millisecond))
}
