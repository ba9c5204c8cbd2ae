package demospace

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/connhold"
)

// startHeldSpace starts a room that asks the box to hold its WebSockets (no control
// socket: nothing here receives its sends).
func startHeldSpace(t *testing.T) *space {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "s.sock")
	return startSpaceAt(t, sock, t.TempDir(), newFakeClock(t0), func(c *Config) { c.Hold = true })
}

// TestHeldResumeCarriesLongMessagesWhole: a tab resuming with ?after= gets the messages
// it missed as the opt-in answer's websocket-events; two of the longest messages (2,000
// characters, over 4 KiB each as JSON) come back whole through the box's parser (which
// once refused an event longer than what was left of a 4 KiB read, and the box answered
// the upgrade with 503).
func TestHeldResumeCarriesLongMessagesWhole(t *testing.T) {
	s := startHeldSpace(t)
	want := []Message{
		s.postMessage("ada", strings.Repeat("é", MaxTextRunes)),
		s.postMessage("bob", strings.Repeat("ж", MaxTextRunes)),
	}
	req, _ := http.NewRequest(http.MethodGet, "http://space.test/api/ws?after=0", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set(connhold.ConnIDHeader, connhold.NewID())
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !connhold.Opted(resp.StatusCode, resp.Header) {
		t.Fatalf("the upgrade was answered %d %q, not held", resp.StatusCode, resp.Header.Get(connhold.HoldHeader))
	}
	reply, err := connhold.ParseReply(resp.Header, body)
	if err != nil {
		t.Fatalf("the box cannot read the room's answer: %v", err)
	}
	if len(reply.Messages) != len(want) {
		t.Fatalf("%d messages in the answer, want %d", len(reply.Messages), len(want))
	}
	for i, m := range reply.Messages {
		var got Message
		if err := json.Unmarshal(m.Payload, &got); err != nil || m.Binary || got != want[i] {
			t.Errorf("message %d: %d bytes, %v; not message %d whole", i, len(m.Payload), err, want[i].ID)
		}
	}
}

// TestHeldEventsOfEverySizeAreAcknowledgedOnOneConnection: the box's events, up to its
// largest message, are acknowledged, and the room reads each body, so its server keeps
// the box's connection for the next event (Go's server closes one with more than 256 KiB
// left unread).
func TestHeldEventsOfEverySizeAreAcknowledgedOnOneConnection(t *testing.T) {
	s := startHeldSpace(t)
	ec := &connhold.EventClient{Socket: s.sock}
	defer ec.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := connhold.NewID()
	for i, n := range []int{4 << 10, 256<<10 - 1, 256 << 10, 256<<10 + 1, 1 << 20} {
		ev := connhold.Event{ConnID: id, Seq: uint64(i + 1), Kind: connhold.KindText, Payload: []byte(strings.Repeat("x", n))}
		if _, err := connhold.PostEvent(ctx, ec, "http://space.test", ev); err != nil {
			t.Fatalf("a %d-byte event: %v", n, err)
		}
		if got := ec.Idle(); got != 1 {
			t.Errorf("after a %d-byte event the box keeps %d connections to the room, want 1", n, got)
		}
	}
	bye := connhold.Event{ConnID: id, Seq: 6, Kind: connhold.KindClose, CloseCode: 1000, Payload: []byte("bye")}
	if _, err := connhold.PostEvent(ctx, ec, "http://space.test", bye); err != nil {
		t.Fatalf("the close event: %v", err)
	}
}
