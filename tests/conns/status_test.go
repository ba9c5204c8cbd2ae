package conns

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// The box's status and its console count the WebSocket connections it holds per space
// (open, parked, and the bytes of acknowledged messages kept until a checkpoint: a kind of
// durability checkpoint, since bucket retires them at their acknowledgement); a space
// with none is left out.
func TestStatusAndConsoleCountHeldConnectionsPerSpace(t *testing.T) {
	const hostA, hostB, hostC = "a.example.com", "b.example.com", "c.example.com"
	cfg := kindConfig(t, "1m", nil)
	cfg.Lchat["kinds"].(map[string]any)["hold"].(map[string]any)["durability"] = "checkpoint"
	consoleAddr := harness.FreeAddr(t, "127.0.0.1")
	cfg.Servers = map[string]any{"console": map[string]any{
		"listen": []string{consoleAddr}, "automatic_https": map[string]any{"disable": true},
		"routes": []any{map[string]any{"handle": []any{map[string]any{"handler": "lchat_console"}}}},
	}}
	b := startBoxOf(t, cfg, hostA, hostB, hostC)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a1 := dialHeldClient(t, ctx, b, hostA, nil)
	dialHeldClient(t, ctx, b, hostA, nil)
	bc := dialHeldClient(t, ctx, b, hostB, nil)
	a1.startReading(ctx)
	// Acknowledged, and kept by the box until a checkpoint (this kind checkpoints when it
	// sleeps): the message, and each connection's whoami (6 bytes).
	if got := a1.ask(t, ctx, "apply hello"); got != "ack hello" {
		t.Fatalf("answer %q", got)
	}
	type conns struct {
		Open         int   `json:"open"`
		Parked       int   `json:"parked"`
		PendingBytes int64 `json:"pending_bytes"`
	}
	status := func() map[string]conns {
		var st struct {
			Conns map[string]conns `json:"conns"`
		}
		b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
		return st.Conns
	}
	console := func() map[string]conns {
		resp, err := http.Get("http://" + consoleAddr + "/api/spaces")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var spaces []struct {
			Host  string `json:"host"`
			Conns *conns `json:"conns"`
		}
		if err := json.Unmarshal(raw, &spaces); err != nil {
			t.Fatalf("console /api/spaces: %v: %s", err, raw)
		}
		out := map[string]conns{}
		for _, s := range spaces {
			if s.Conns != nil {
				out[s.Host] = *s.Conns
			}
		}
		return out
	}
	want := map[string]conns{hostA: {2, 2, 6 + 6 + 11}, hostB: {1, 1, 6}}
	var got map[string]conns
	harness.WaitFor(t, 30*time.Second, "the status to count each space's connections", func() bool {
		got = status()
		return reflect.DeepEqual(got, want)
	})
	if got := console(); !reflect.DeepEqual(got, want) {
		t.Errorf("the console's spaces show %v, want %v", got, want)
	}
	bc.c.CloseNow()
	want[hostB] = conns{0, 0, 6}
	harness.WaitFor(t, 30*time.Second, "space B's socket counted closed", func() bool {
		got = status()
		return reflect.DeepEqual(got, want)
	})
}
