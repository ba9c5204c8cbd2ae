package meshe2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// roomMessage is a message of the demo room as its held WebSockets and event stream
// carry it.
type roomMessage struct {
	ID   int64  `json:"id"`
	Text string `json:"text"`
}

// received checks one client's messages across the failover: ids strictly rising (none
// twice, none out of order), and the same messages as the room's, with the same ids: the
// client saw every message, and the room lost none it had sent.
func received(t *testing.T, who string, got []roomMessage, room map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	for i, m := range got {
		if i > 0 && m.ID <= got[i-1].ID {
			t.Errorf("%s: message %d (%q) after %d: ids not rising", who, m.ID, m.Text, got[i-1].ID)
		}
		if id, ok := room[m.Text]; !ok {
			t.Errorf("%s received %q (id %d), which the room lost after the takeover", who, m.Text, m.ID)
		} else if id != m.ID {
			t.Errorf("%s received %q as id %d; the room has it as %d", who, m.Text, m.ID, id)
		}
		seen[m.Text] = true
	}
	if lost := missing(keys(room), seen); len(lost) > 0 {
		t.Errorf("%s never received %d of the room's %d messages: %v", who, len(lost), len(room), lost)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestHeldConnectionsAcrossALogTakeover: the demo room with held connections
// (DEMO_HOLD_CONNECTIONS=1) rides the log alone; a WebSocket and a resumable event stream
// are held at the entry box, the room runs on another. 20 messages are posted, each
// answered 201 and pushed to both (the room's sends wait at its output gate); the room's
// box is killed right after the WebSocket got the last one. The room wakes on a survivor
// from the manifest and the log, and more messages are posted. Every message either
// client received is in the room with the same id (none lost), every message of the room
// reached both clients on their same connections, each once and in order. Run for both
// durabilities that ship a log: with standby, the room's standby takes it over as soon as
// the kill is seen (engine.TakeOver), possibly while the clients' next messages are in
// flight.
func TestHeldConnectionsAcrossALogTakeover(t *testing.T) {
	for _, durability := range []string{"bucket", "standby"} {
		t.Run(durability, func(t *testing.T) { heldAcrossALogTakeover(t, durability) })
	}
}

func heldAcrossALogTakeover(t *testing.T, durability string) {
	c := newCluster(t)
	c.kind = logOnlyKind(map[string]any{"env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"}, "durability": durability})
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	// Owned by b; once b is gone, by cc (the box that takes it over may be a: the first
	// post after the kill can reach a before it counts b dead).
	host := hostMoving(t, "heldlog", a, b, cc)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
	c.post(a, host, "first")
	if got := awakeOn(t, host, a, b, cc); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}

	h := holdRoom(t, c, a, host)
	h.until(t, "first")

	var acked []string
	for i := range 20 {
		text := fmt.Sprintf("before-%d", i)
		c.post(a, host, text)
		acked = append(acked, text)
	}
	h.ws(t, "before-19")
	b.Kill()

	var code int
	harness.WaitFor(t, deadAfter+30*time.Second, "a post after the kill", func() bool {
		code, _ = c.postText(a, host, "after the kill")
		return code == http.StatusCreated
	}, func() string { return fmt.Sprintf("last status %d", code) })
	acked = append(acked, "after the kill")
	for i := range 5 {
		text := fmt.Sprintf("after-%d", i)
		c.post(a, host, text)
		acked = append(acked, text)
	}
	if got := awakeOn(t, host, a, cc); len(got) != 1 || got[0] != cc.self {
		t.Logf("after the kill %s is awake on %v (its owner is %s)", host, got, cc.self)
	}
	h.until(t, "after-4")

	room, code, err := c.roomTexts(a, host)
	if code != http.StatusOK {
		t.Fatalf("reading the room after the takeover: %d %v", code, err)
	}
	if lost := missing(acked, room); len(lost) > 0 {
		t.Fatalf("%d of %d messages answered 201 are gone after the takeover: %v", len(lost), len(acked), lost)
	}
	h.check(t, room)
}

// heldRoom is a WebSocket and a resumable event stream of a demo room (a kind with
// DEMO_HOLD_CONNECTIONS=1) held at an entry box, and the messages each received.
type heldRoom struct {
	tab      *heldClient
	lines    <-chan string
	done     <-chan error
	wss, sse []roomMessage
}

// holdRoom opens both through entry, from the room's first message.
func holdRoom(t *testing.T, c *cluster, entry *node, host string) *heldRoom {
	t.Helper()
	h := &heldRoom{tab: dialHeld(t, c, entry, host, "/api/ws?after=0")}
	h.lines, h.done = sseLines(t, c, entry, host, "/api/events?after=0")
	return h
}

// ws reads the WebSocket until the message text.
func (h *heldRoom) ws(t *testing.T, text string) {
	t.Helper()
	for len(h.wss) == 0 || h.wss[len(h.wss)-1].Text != text {
		var m roomMessage
		raw := h.tab.next(t, deadAfter+30*time.Second, "the WebSocket's message "+text)
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("a WebSocket message: %v: %q", err, raw)
		}
		h.wss = append(h.wss, m)
	}
}

// until reads both until the message text.
func (h *heldRoom) until(t *testing.T, text string) {
	t.Helper()
	h.ws(t, text)
	for len(h.sse) == 0 || h.sse[len(h.sse)-1].Text != text {
		var m roomMessage
		raw := nextData(t, h.lines, h.done, deadAfter+30*time.Second, "the event stream's message "+text)
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("an event: %v: %q", err, raw)
		}
		h.sse = append(h.sse, m)
	}
}

// check checks that each received every message of room (text -> id) once, in order, with
// the room's ids.
func (h *heldRoom) check(t *testing.T, room map[string]int64) {
	t.Helper()
	received(t, "the held WebSocket", h.wss, room)
	received(t, "the held event stream", h.sse, room)
	t.Logf("the room has %d messages; the WebSocket got %d, the event stream %d, on the same connections", len(room), len(h.wss), len(h.sse))
}
