package meshe2e

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// refusedWithin bounds how long an answer whose commits cannot land waits before its
// 503: the gate's deadline and some slack for a loaded machine.
const refusedWithin = engine.DurableAnswerTimeout + 3*time.Second

// timedAnswer is one request's outcome, for requests that wait at the gate in the
// background.
type timedAnswer struct {
	code    int
	retry   string // Retry-After
	body    string
	elapsed time.Duration
}

func (c *cluster) timedDo(n *node, method, host, path, body string) <-chan timedAnswer {
	ch := make(chan timedAnswer, 1)
	go func() {
		start := time.Now()
		code, hdr, data, _ := c.doH(n, method, host, path, body, nil)
		ch <- timedAnswer{code, hdr.Get("Retry-After"), data, time.Since(start)}
	}()
	return ch
}

// holdNextSegment arms n's bucket link to hold the next PUT of a segment of host's log,
// calls start (which sends the write that segment will carry) and returns once the PUT is
// caught; the test's end releases it.
func holdNextSegment(t *testing.T, n *node, host string, start func()) *harness.Held {
	t.Helper()
	logKey := []byte("/spaces/" + host + "/log/")
	held := n.bucketProxy.Hold(func(b []byte) bool { return bytes.HasPrefix(b, []byte("PUT ")) && bytes.Contains(b, logKey) })
	t.Cleanup(held.Release)
	start()
	select {
	case <-held.Caught():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s shipped no segment of %s in 20 s", n.self, host)
	}
	return held
}

// refused checks that a write whose commits could not land was refused: a 503 with
// Retry-After within refusedWithin, never a 201.
func refused(t *testing.T, what string, a timedAnswer) {
	t.Helper()
	if a.code != http.StatusServiceUnavailable || a.retry == "" {
		t.Fatalf("%s: %d (Retry-After %q) after %v, want 503 with Retry-After: %.200s", what, a.code, a.retry, a.elapsed, a.body)
	}
	// The box's 503 page (plain text without an Accept), not the instance's answer.
	if !strings.Contains(a.body, "is not available right now") {
		t.Errorf("%s: the 503's body is not the box's page: %.200s", what, a.body)
	}
	if a.elapsed > refusedWithin {
		t.Errorf("%s was refused after %v, want within %v", what, a.elapsed, refusedWithin)
	}
	t.Logf("%s: 503, Retry-After %s, after %v", what, a.retry, a.elapsed.Round(time.Millisecond))
}

// durableRoom starts two boxes, the second (the holder) with its bucket link through a
// proxy, and a room of a log-only kind awake on the holder with five messages answered
// 201 (returned).
func durableRoom(t *testing.T, c *cluster, tag string) (entry, holder *node, host string, acked []string) {
	t.Helper()
	c.kind = logOnlyKind(nil)
	entry = c.start(false)
	holder = c.start(true)
	harness.WaitFor(t, 15*time.Second, "two live members", func() bool { return len(status(t, entry).Mesh.Live) == 2 })
	host = hostOwnedBy(t, tag, holder, entry, holder)
	c.createSpace(entry, host)
	harness.WaitFor(t, 5*time.Second, "the row on the holder", func() bool { return hasRoute(holder, host) })
	for i := range 5 {
		text := fmt.Sprintf("before-%d", i)
		c.post(holder, host, text)
		acked = append(acked, text)
	}
	if got := awakeOn(t, host, entry, holder); len(got) != 1 || got[0] != holder.self {
		t.Fatalf("%s awake on %v, want %s", host, got, holder.self)
	}
	return entry, holder, host, acked
}

// healedKeepsEverything posts five more messages through the holder, each answered 201,
// kills the holder and checks that the other box serves the room with every message
// answered 201. It returns the room's messages.
func healedKeepsEverything(t *testing.T, c *cluster, entry, holder *node, host string, acked []string, deadAfter time.Duration) map[string]int64 {
	t.Helper()
	for i := range 5 {
		text := fmt.Sprintf("after-%d", i)
		c.post(holder, host, text)
		acked = append(acked, text)
	}
	holder.Kill()
	var got map[string]int64
	harness.WaitFor(t, deadAfter+30*time.Second, "the room served by the other box", func() bool {
		var code int
		got, code, _ = c.roomTexts(entry, host)
		return code == http.StatusOK
	})
	if lost := missing(acked, got); len(lost) > 0 {
		t.Fatalf("after the holder's kill, %d of %d writes answered 201 are gone: %v", len(lost), len(acked), lost)
	}
	return got
}

// TestCutBucketRefusesWritesThenHeals: the holder's bucket link is cut (connections
// closed, new ones refused) with the room awake and riding the log. A read of committed
// data still answers at once (nothing new to ship); a write commits in the instance but
// its answer waits at the output gate and becomes a 503 with Retry-After within about
// engine.DurableAnswerTimeout, never a 201. Once the link is back the writes get 201
// again, and after a kill -9 of the holder the other box has every one of them.
//
// The boxes' dead_after is long here so that the cut holder does not fence itself (and
// stop the room, which fails the waiting answers at once) while the cut lasts: the test
// is about a bucket that is gone while the box is still the holder.
func TestCutBucketRefusesWritesThenHeals(t *testing.T) {
	const cutDeadAfter = 18 * time.Second // fences 17 s after its last heartbeat write
	c := newCluster(t)
	c.mesh = map[string]any{"dead_after": cutDeadAfter.String(), "fence_margin": "1s"}
	a, b, host, acked := durableRoom(t, c, "cut")

	b.bucketProxy.SetDown(true)
	cut := time.Now()
	start := time.Now()
	got, code, err := c.roomTexts(b, host)
	if code != http.StatusOK {
		t.Fatalf("a read with the bucket cut: %d %v, want 200", code, err)
	}
	if lost := missing(acked, got); len(lost) > 0 {
		t.Fatalf("a read with the bucket cut lacks %v", lost)
	}
	t.Logf("a read with the bucket cut and nothing pending: 200 in %v", time.Since(start).Round(time.Millisecond))

	refused(t, "a write with the bucket cut", <-c.timedDo(b, "POST", host, "/api/messages", `{"author":"test","text":"during-the-cut"}`))
	b.bucketProxy.SetDown(false)
	t.Logf("the bucket was cut for %v", time.Since(cut).Round(time.Millisecond))
	if !status(t, b).awake(host) {
		t.Fatalf("%s let the room go during the cut (fenced?): the test needs it the holder throughout", b.self)
	}
	if g, ok := gateOf(t, b, host); !ok || g.Failed == 0 {
		t.Errorf("the holder's status counts no refused answer: %+v (awake %v)", g, ok)
	}

	got = healedKeepsEverything(t, c, a, b, host, acked, cutDeadAfter)
	_, kept := got["during-the-cut"]
	t.Logf("every write answered 201 kept; the refused one is there too: %v (it committed; its segment landed after the heal)", kept)
}

// TestStalledSegmentRefusesAnswers: the bucket takes longer than the gate's deadline to
// answer the holder's next log segment (its PUT held on the link), the other traffic
// flowing. The write the segment carries gets a 503 with Retry-After within about
// engine.DurableAnswerTimeout, never a 201; a read that comes after it waits at the gate
// too, and shows the refused write only once a later append of it landed (then it must
// survive the holder, as a 201 must). The box's status answers throughout. Once the bucket
// answers, writes get 201 again, and after a kill -9 of the holder the other box has every
// one of them.
func TestStalledSegmentRefusesAnswers(t *testing.T) {
	c := newCluster(t)
	a, b, host, acked := durableRoom(t, c, "stall")

	var wrote <-chan timedAnswer
	held := holdNextSegment(t, b, host, func() {
		wrote = c.timedDo(b, "POST", host, "/api/messages", `{"author":"test","text":"in-the-stalled-segment"}`)
	})
	read := c.timedDo(b, "GET", host, "/api/messages?limit=1000", "")
	// The box's status answers while a segment is stuck on the bucket (gateOf fails the
	// test past 5 s), and shows the write waiting at the gate.
	if g, ok := gateOf(t, b, host); !ok || g.Waiting == 0 {
		t.Errorf("the holder's status during the stall: %+v (awake %v), want the write waiting", g, ok)
	}

	refused(t, "the write the stalled segment carries", <-wrote)
	// The read waits at the gate too: it is answered once a shipment that started after it
	// landed (the stalled append is given up after its deadline and sent again, and the
	// bucket takes the second one), or refused. What it reveals is then in the bucket: a
	// write it shows must survive the holder, as a write answered 201 does.
	r := <-read
	revealed := r.code == http.StatusOK && strings.Contains(r.body, "in-the-stalled-segment")
	if r.code != http.StatusServiceUnavailable && r.code != http.StatusOK || r.elapsed > refusedWithin {
		t.Errorf("a read behind the stalled segment: %d after %v, want a 503 or an answer within %v", r.code, r.elapsed, refusedWithin)
	}
	if revealed {
		acked = append(acked, "in-the-stalled-segment")
	}
	t.Logf("a read behind the stalled segment: %d after %v (shows the refused write: %v)", r.code, r.elapsed.Round(time.Millisecond), revealed)

	held.Release()
	select {
	case <-held.Answered():
	case <-time.After(20 * time.Second):
		t.Fatal("the bucket did not answer the stalled segment in 20 s after its release")
	}
	if g, ok := gateOf(t, b, host); !ok || g.Failed < 1 {
		t.Errorf("the holder's status counts %d refused answers, want at least the write's (awake %v)", g.Failed, ok)
	}
	got := healedKeepsEverything(t, c, a, b, host, acked, deadAfter)
	_, kept := got["in-the-stalled-segment"]
	t.Logf("every write answered 201 kept; the refused one is there too: %v (its segment landed late)", kept)
}
