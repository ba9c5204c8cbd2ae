package conns

import (
	"context"
	"reflect"
	"testing"
	"time"
)

// The box's status counts the WebSocket connections it holds per space (open, parked,
// and the bytes of acknowledged messages kept until a checkpoint), as the console shows
// them; a space with none is left out.
func TestStatusCountsHeldConnectionsPerSpace(t *testing.T) {
	const hostA, hostB, hostC = "a.example.com", "b.example.com", "c.example.com"
	b := startKindBox(t, "1m", nil, hostA, hostB, hostC)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a1 := dialHeldClient(t, ctx, b, hostA, nil)
	dialHeldClient(t, ctx, b, hostA, nil)
	bc := dialHeldClient(t, ctx, b, hostB, nil)
	a1.startReading(ctx)
	// Acknowledged, and kept by the box until a checkpoint (this kind checkpoints when it
	// sleeps); with the whoami of each connection, 6 bytes each.
	if got := a1.ask(t, ctx, "apply hello"); got != "ack hello" {
		t.Fatalf("answer %q", got)
	}
	type conns struct {
		Open         int   `json:"open"`
		Parked       int   `json:"parked"`
		PendingBytes int64 `json:"pending_bytes"`
	}
	want := map[string]conns{hostA: {2, 2, 6 + 6 + 11}, hostB: {1, 1, 6}}
	var got map[string]conns
	waitFor(t, 30*time.Second, "the status to count each space's connections", func() bool {
		var st struct {
			Conns map[string]conns `json:"conns"`
		}
		b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
		got = st.Conns
		return reflect.DeepEqual(got, want)
	})
	bc.c.CloseNow()
	want[hostB] = conns{0, 0, 6}
	waitFor(t, 30*time.Second, "space B's socket counted closed", func() bool {
		var st struct {
			Conns map[string]conns `json:"conns"`
		}
		b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
		got = st.Conns
		return reflect.DeepEqual(got, want)
	})
}
