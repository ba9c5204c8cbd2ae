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
		want("map[s1:{2 2 5} s2:{1 1 0}]"))

	b1.Close(websocket.StatusNormalClosure, "")
	testwait.WaitFor(t, 10*time.Second, "s2 left out once its connection closed", want("map[s1:{2 2 5}]"))

	close(gate) // delivered and acknowledged: still kept until a checkpoint covers it
	// Two events: the message and s2's close.
	testwait.WaitFor(t, 10*time.Second, "the message acknowledged", func() bool { return tb.hub.Stats().Delivered >= 2 })
	if g := got(); g != "map[s1:{2 2 5}]" {
		t.Errorf("after the acknowledgement %s, want the 5 bytes still pending", g)
	}
	tb.hub.CheckpointDone("s1", tb.hub.CheckpointStarted("s1"))
	testwait.WaitFor(t, 10*time.Second, "the checkpoint to free the pending bytes", want("map[s1:{2 2 0}]"))
}
