package connhold

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// SpaceStats counts each space's open and parked connections and the bytes of its
// messages kept for its instances, until a checkpoint covers them; a space whose last
// connection closed is left out.
func TestSpaceStatsCountEachSpace(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	gate := make(chan struct{})
	tb.app.mu.Lock()
	tb.app.gate = gate // deliveries wait: the message stays pending
	tb.app.mu.Unlock()
	a1 := tb.dial(t, nil)
	tb.dial(t, nil)
	b1 := tb.dial(t, http.Header{"X-Space": {"s2"}})
	ctx := context.Background()
	if err := a1.Write(ctx, websocket.MessageText, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	got := func() string { return fmt.Sprint(tb.hub.SpaceStats()) }
	want := func(w string) func() bool { return func() bool { return got() == w } }
	testwait.WaitFor(t, 10*time.Second, "s1: 2 open, parked, 5 bytes pending; s2: 1 open",
		want("map[s1:{2 2 0 5} s2:{1 1 0 0}]"))

	b1.Close(websocket.StatusNormalClosure, "")
	testwait.WaitFor(t, 10*time.Second, "s2 left out once its connection closed", want("map[s1:{2 2 0 5}]"))

	close(gate) // delivered and acknowledged: still kept until a checkpoint covers it
	// Two events: the message and s2's close.
	testwait.WaitFor(t, 10*time.Second, "the message acknowledged", func() bool { return tb.hub.Stats().Delivered >= 2 })
	if g := got(); g != "map[s1:{2 2 0 5}]" {
		t.Errorf("after the acknowledgement %s, want the 5 bytes still pending", g)
	}
	tb.hub.CheckpointDone("s1", tb.hub.CheckpointStarted("s1"))
	testwait.WaitFor(t, 10*time.Second, "the checkpoint to free the pending bytes", want("map[s1:{2 2 0 0}]"))
}

// Held event streams are held connections too: counted by space beside the WebSockets
// from StreamHeld until done, in the box's totals and each space's figures; a space with
// only streams is listed, and one whose last stream ended is left out. done counts once.
func TestStreamsCountedBesideWebSockets(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	tb.dial(t, nil) // one WebSocket of s1
	got := func() string { return fmt.Sprint(tb.hub.SpaceStats()) }
	testwait.WaitFor(t, 10*time.Second, "s1's WebSocket parked", func() bool { return got() == "map[s1:{1 1 0 0}]" })

	s1a, s1b, s2 := tb.hub.StreamHeld("s1"), tb.hub.StreamHeld("s1"), tb.hub.StreamHeld("s2")
	if g := got(); g != "map[s1:{1 1 2 0} s2:{0 0 1 0}]" {
		t.Fatalf("with two streams of s1 and one of s2: %s", g)
	}
	if st := tb.hub.Stats(); st.Streams != 3 || st.Held != 1 {
		t.Fatalf("box totals: %d streams, %d WebSockets; want 3 and 1", st.Streams, st.Held)
	}
	s2()
	s2() // a second call changes nothing
	s1a()
	if g := got(); g != "map[s1:{1 1 1 0}]" {
		t.Fatalf("after s2's stream and one of s1's ended: %s", g)
	}
	s1b()
	if st := tb.hub.Stats(); st.Streams != 0 {
		t.Fatalf("every stream ended: %d counted", st.Streams)
	}
	if g := got(); g != "map[s1:{1 1 0 0}]" {
		t.Fatalf("every stream ended: %s", g)
	}
}
