package conns

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

// The demo room with DEMO_HOLD_CONNECTIONS=1 lets the box hold its WebSocket and resume
// its event stream: with both open the space sleeps, and a message posted afterwards (it
// wakes the space) reaches both, on the same connections.
func TestDemoRoomStreamsLetTheSpaceSleep(t *testing.T) {
	cfg := harness.Config{
		Bucket: map[string]any{"backend": "file", "root": "{$LCHAT_TEST_DIR}/bucket"},
		Lchat: map[string]any{"kinds": map[string]any{"room": harness.DemoKind(map[string]any{
			"idle_timeout": "1s", "isolation": "none", "network": "host",
			"replication": map[string]any{"class": "sleep"},
			"env":         map[string]string{"DEMO_HOLD_CONNECTIONS": "1"},
		})}},
	}
	b := harness.StartBox(t, harness.BoxOptions{JSON: cfg.JSON()})
	const host = "room.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "room"}, http.StatusCreated, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	req, _ := http.NewRequestWithContext(ctx, "GET", b.URL(host, "/api/events"), nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := b.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /api/events: %v %v", resp, err)
	}
	defer resp.Body.Close()
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- d
			}
		}
		close(events)
	}()
	ws, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+"/api/ws", &websocket.DialOptions{Host: host})
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	defer ws.CloseNow()

	harness.WaitFor(t, 30*time.Second, "the room asleep with a WebSocket and an event stream open", func() bool {
		st, _ := spaceState(t, b, host)
		return st == "asleep"
	})
	post, _ := http.NewRequest("POST", b.URL(host, "/api/messages"), strings.NewReader(`{"author":"t","text":"while asleep"}`))
	post.Header.Set("Content-Type", "application/json")
	pr, err := b.Client().Do(post)
	if err != nil || pr.StatusCode != http.StatusCreated {
		t.Fatalf("posting: %v %v", pr, err)
	}
	pr.Body.Close()

	var m struct {
		Text string `json:"text"`
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	if err := wsjson.Read(rctx, ws, &m); err != nil || m.Text != "while asleep" {
		t.Fatalf("websocket message %+v, %v", m, err)
	}
	select {
	case d, ok := <-events:
		if !ok || !strings.Contains(d, "while asleep") {
			t.Fatalf("event %q (open %v)", d, ok)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event on the resumed stream within 30s")
	}
}
