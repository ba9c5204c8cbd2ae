package single

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// An open server-sent-events stream or WebSocket keeps a space awake past its idle
// timeout (1s for the "nap" kind), carries messages through lchat as they are posted
// (no buffering by the proxy), and the space sleeps once the last one closes.
func TestOpenStreamsKeepSpaceAwake(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	const host = "live.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "nap"}, http.StatusCreated, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Server-sent events.
	sseCtx, sseCancel := context.WithCancel(ctx)
	defer sseCancel()
	req, _ := http.NewRequestWithContext(sseCtx, "GET", b.URL(host, "/api/events"), nil)
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET /api/events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- data
			}
		}
		close(events)
	}()

	// WebSocket, through the same proxy.
	ws, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+"/api/ws", &websocket.DialOptions{Host: host})
	if err != nil {
		t.Fatalf("websocket through lchat: %v", err)
	}
	defer ws.CloseNow()

	_, pid := space(t, b, host)
	if pid == 0 {
		t.Fatal("no instance behind the open streams")
	}
	// Several idle timeouts with no request but the two open streams.
	time.Sleep(3 * time.Second)
	if st, p := space(t, b, host); st != "awake" || p != pid {
		t.Fatalf("with a stream open past the idle timeout the space is %s pid %d, want awake pid %d", st, p, pid)
	}

	postMessage(t, b, host, "pushed live")
	select {
	case data := <-events:
		if !strings.Contains(data, "pushed live") {
			t.Fatalf("SSE event %q", data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no server-sent event through lchat within 10s of the post")
	}
	var m struct {
		Text string `json:"text"`
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := wsjson.Read(rctx, ws, &m); err != nil || m.Text != "pushed live" {
		t.Fatalf("websocket message %+v, %v; want the posted one", m, err)
	}

	// Closing the SSE stream alone is not enough: the WebSocket still holds the space.
	sseCancel()
	time.Sleep(2 * time.Second)
	if st, p := space(t, b, host); st != "awake" || p != pid {
		t.Fatalf("with the WebSocket still open the space is %s pid %d, want awake", st, p)
	}
	ws.Close(websocket.StatusNormalClosure, "")
	harness.WaitFor(t, 30*time.Second, "sleep once every stream closed", func() bool {
		st, p := space(t, b, host)
		return st == "asleep" && p == 0
	})
}
