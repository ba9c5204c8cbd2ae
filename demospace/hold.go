package demospace

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// Held connections (docs/connections.md): with Config.Hold the room asks the box to hold
// its WebSockets and to resume its event stream across sleeps, so open connections do not
// keep the space awake. A new message reaches held WebSockets through the box's control
// endpoint (Config.ControlSocket), tagged "room".

const (
	holdTag = "room"
	// controlTimeout bounds a send to the held WebSockets. The box may hold a send at its
	// output gate until the commits before it are durable (up to 10 s, its durability
	// deadline) and waits up to 3 s for each other box's part: a shorter bound drops the
	// message for every held socket while a standby is being given up.
	controlTimeout = 15 * time.Second
)

// newControlClient dials the box's control endpoint; nil without a socket.
func newControlClient(socket string) *http.Client {
	if socket == "" {
		return nil
	}
	var d net.Dialer
	return &http.Client{Timeout: controlTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

// handleHeldWS answers a WebSocket upgrade the box will hold: the backlog the client
// missed (after Last-Event-ID or ?after=) as the first messages, and the room's tag.
func (s *Server) handleHeldWS(w http.ResponseWriter, r *http.Request, last int64) {
	backlog, ok := s.backlog(w, r, last)
	if !ok {
		return
	}
	var body []byte
	for _, m := range backlog {
		b, _ := json.Marshal(m)
		body = fmt.Appendf(body, "TEXT %x\r\n%s\r\n", len(b), b)
	}
	h := w.Header()
	h.Set("Lchat-Ws", "hold")
	h.Set("Lchat-Set-Tags", holdTag)
	h.Set("Content-Type", "application/websocket-events")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// heldEventBody is how much of an event's body the room reads before it answers: the
// box's largest message by default (its max_message).
const heldEventBody = 1 << 20

// handleHeldEvent acknowledges a held connection's event: the room is push-only over
// WebSockets (clients post with POST /api/messages), so messages and closes are only
// acknowledged. It reads the body first all the same: Go's server closes a connection
// whose request left more than 256 KiB unread, and the box would dial again for the next
// event.
func (s *Server) handleHeldEvent(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, io.LimitReader(r.Body, heldEventBody))
	w.WriteHeader(http.StatusNoContent)
}

// sendHeldLocked sends m to every held WebSocket of the room. It runs with writeMu held,
// so held connections see messages in id order like the other subscribers. A box without
// held connections has no control socket yet: nothing to send.
func (s *Server) sendHeldLocked(m Message) {
	if s.control == nil {
		return
	}
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://box/.lchat/ws/send?tag="+holdTag, bytes.NewReader(b))
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	resp, err := s.control.Do(req)
	if err != nil {
		s.logger.Debug("sending to held connections", zap.Error(err))
		return
	}
	resp.Body.Close()
}
