package meshe2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestPipelineGapIsNeverAcknowledged: the holder lands several log segments at once (the
// gate's pipeline). One segment is caught on its bucket link (the link's proxy holds the
// PUT) while a later segment, carrying a later write, lands beside it: the later write's
// client still waits, since an answer goes out only once every segment before its own has
// landed. Then the holder is killed. The other box reads the log up to the gap, leaves the
// landed segment past it unapplied (a segment extends the state the one before it left),
// seals the gap and serves the room: every write answered 201 is there, the room is
// whole, and neither write of the stuck segments was ever answered 201.
func TestPipelineGapIsNeverAcknowledged(t *testing.T) {
	c := newCluster(t)
	entry, holder, host, acked := durableRoom(t, c, "gap")
	before, ok := gateOf(t, holder, host)
	if !ok || before.Segments == 0 {
		t.Fatalf("%s ships no log for %s (%+v, %v)", holder.self, host, before, ok)
	}

	var first <-chan timedAnswer
	holdNextSegment(t, holder, host, func() {
		first = c.timedDo(holder, "POST", host, "/api/messages", `{"author":"test","text":"in-the-stuck-segment"}`)
	})
	// The next write's segment goes out on another connection and lands.
	later := c.timedDo(holder, "POST", host, "/api/messages", `{"author":"test","text":"past-the-gap"}`)
	harness.WaitFor(t, 20*time.Second, "a later segment to land while both writes still wait at the gate", func() bool {
		g, ok := gateOf(t, holder, host)
		return ok && g.Segments > before.Segments && g.Waiting >= 2
	})
	select {
	case a := <-later:
		t.Fatalf("the write past the gap was answered %d before the segment ahead of it landed", a.code)
	case a := <-first:
		t.Fatalf("the write in the stuck segment was answered %d", a.code)
	default:
	}

	holder.Kill()
	for what, ch := range map[string]<-chan timedAnswer{"the write in the stuck segment": first, "the write past the gap": later} {
		select {
		case a := <-ch:
			if a.code == http.StatusCreated {
				t.Errorf("%s was answered 201", what)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s got no answer and no error in 20 s after the kill", what)
		}
	}

	var got map[string]int64
	harness.WaitFor(t, deadAfter+30*time.Second, "the room served by the other box", func() bool {
		var code int
		got, code, _ = c.roomTexts(entry, host)
		return code == http.StatusOK
	})
	if lost := missing(acked, got); len(lost) > 0 {
		t.Fatalf("after the holder's kill, %d of %d writes answered 201 are gone: %v", len(lost), len(acked), lost)
	}
	if has(got, "past-the-gap") {
		t.Errorf("the write past the gap is in the room: the segment after the gap was applied")
	}
	// The room takes writes again on the other box: the seal filled the gap, and the new
	// holder appends after the orphan.
	c.post(entry, host, "after-the-takeover")
	if got, _, _ = c.roomTexts(entry, host); !has(got, "after-the-takeover") {
		t.Errorf("the write after the takeover is not in the room: %v", got)
	}
}

// TestTimerWriteIsShippedUnasked: a commit the instance makes on its own, answering nobody
// (durable_walapp's POST /later: a 202, then the insert 300 ms later), lands in the space's log within
// the log's interval with no answer waiting at the gate, so a kill -9 of the holder after
// that keeps it.
func TestTimerWriteIsShippedUnasked(t *testing.T) {
	c := newCluster(t)
	c.kind = logOnlyKind(map[string]any{
		"command": harness.Program(t, "lchat-test-durable-walapp", "./tests/meshe2e/durable_walapp"),
		"args":    []string{},
	})
	a, b := c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	host := hostOwnedBy(t, "timer", b, a, b)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on the holder", func() bool { return hasRoute(b, host) })
	c.mustDo(b, "POST", host, "/rows", "asked", http.StatusCreated)
	before, ok := gateOf(t, b, host)
	if !ok || before.Segments == 0 {
		t.Fatalf("%s ships no log for %s (%+v, %v)", b.self, host, before, ok)
	}

	// The row is committed 300 ms after the 202, and nothing is asked of the space from
	// then on (a request would wait at the gate, and ship it): the log ships it by itself.
	c.mustDo(b, "POST", host, "/later", "on-its-own", http.StatusAccepted)
	harness.WaitFor(t, 10*time.Second, "the unasked row's segment to land", func() bool {
		g, ok := gateOf(t, b, host)
		return ok && g.Segments > before.Segments
	})
	b.Kill()
	var body string
	harness.WaitFor(t, deadAfter+30*time.Second, "the other box to serve the space", func() bool {
		code, got, err := c.do(a, "GET", host, "/rows", "", nil)
		body = got
		return err == nil && code == http.StatusOK
	})
	for _, want := range []string{"asked", "on-its-own"} {
		if !strings.Contains(body, `"`+want+`"`) {
			t.Errorf("after the holder's kill the row %q is gone: %.300s", want, body)
		}
	}
}

func has[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}
