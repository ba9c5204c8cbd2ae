package demospace

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"go.uber.org/zap"
)

// subscriberBuffer is how many messages a live connection may lag behind
// before it is cut off; the client reconnects and catches up from the database.
const subscriberBuffer = 64

// streamWriteTimeout bounds one write to a live connection, so a client that
// stopped reading cannot pin a goroutine forever.
const streamWriteTimeout = 10 * time.Second

// backlogLimit caps the messages replayed to a reconnecting client.
const backlogLimit = 1000

// hub fans new messages out to live connections (SSE and WebSocket).
type hub struct {
	mu   sync.Mutex
	subs map[chan Message]struct{}
}

// subscribe returns a channel of new messages. The channel is closed when the
// subscriber falls too far behind.
func (h *hub) subscribe() chan Message {
	ch := make(chan Message, subscriberBuffer)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = make(map[chan Message]struct{})
	}
	h.subs[ch] = struct{}{}
	return ch
}

func (h *hub) unsubscribe(ch chan Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

// publish never blocks: a subscriber whose buffer is full is dropped.
func (h *hub) publish(msgs ...Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		for _, m := range msgs {
			select {
			case ch <- m:
				continue
			default:
			}
			delete(h.subs, ch)
			close(ch)
			break
		}
	}
}

// resumeFrom reads where a reconnecting client left off: the SSE
// Last-Event-ID header, else the ?after= query parameter. It returns -1 when
// the client has no position (it only wants new messages).
func resumeFrom(r *http.Request) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("after")
	}
	if v == "" {
		return -1, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid resume position %q: want a message id", v)
	}
	return n, nil
}

// backlog reads the messages after last that a reconnecting client missed (none
// when last < 0), answering the client itself when it cannot.
func (s *Server) backlog(w http.ResponseWriter, r *http.Request, last int64) ([]Message, bool) {
	if last < 0 {
		return nil, true
	}
	msgs, err := s.store.messages(r.Context(), last, backlogLimit)
	if err != nil {
		s.logger.Error("reading backlog", zap.Error(err))
		writeError(w, http.StatusInternalServerError, "reading messages failed")
		return nil, false
	}
	return msgs, true
}

// handleEvents streams messages as server-sent events. An open stream is what
// keeps a space awake behind the proxy, so it lives until the client leaves or
// the server shuts down, with a comment line every keepalive interval so
// intermediaries do not time it out.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	last, err := resumeFrom(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Subscribe before reading the backlog so nothing falls in between; ids
	// already sent are skipped below.
	sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)
	backlog, ok := s.backlog(w, r, last)
	if !ok {
		return
	}
	// A stream opened with no position starts at the newest message, and says so in its
	// first block (an id field with no data: it sets the client's last event id and
	// dispatches nothing). A client that reconnects before any message came, or the box
	// resuming the stream after the space slept, then gets every message posted since
	// it opened, the one that woke the space among them; without it the reopened stream
	// would have no Last-Event-ID and start from whatever is newest by then.
	opening := ""
	if last < 0 {
		id, err := s.store.latestID(r.Context())
		if err != nil {
			s.logger.Error("reading the latest message id", zap.Error(err))
			writeError(w, http.StatusInternalServerError, "reading messages failed")
			return
		}
		last, opening = id, fmt.Sprintf("id: %d\n", id)
	}

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	if s.hold {
		h.Set("Lchat-Sse", "resumable") // every event has its id: the box may resume it
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	write := func(format string, args ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		if rc.Flush() != nil {
			return false
		}
		// Clear it again: a deadline that lapses while the stream idles would
		// fail the final chunk written after the handler returns.
		_ = rc.SetWriteDeadline(time.Time{})
		return true
	}
	send := func(m Message) bool {
		if m.ID <= last {
			return true
		}
		b, _ := json.Marshal(m)
		last = m.ID
		return write("id: %d\nevent: message\ndata: %s\n\n", m.ID, b)
	}

	tick := s.clock.NewTicker(s.keepalive)
	defer tick.Stop()
	if !write("retry: 3000\n%s: connected\n\n", opening) {
		return
	}
	for _, m := range backlog {
		if !send(m) {
			return
		}
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		case m, ok := <-sub:
			if !ok {
				return // too slow; the client reconnects with Last-Event-ID
			}
			if !send(m) {
				return
			}
		case <-tick.C():
			if !write(": keepalive\n\n") {
				return
			}
		}
	}
}

// handleWS streams messages over a WebSocket as JSON objects, one per
// message. It is push-only: clients post with POST /api/messages. The server
// pings every keepalive interval.
func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	last, err := resumeFrom(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if s.hold && r.Header.Get("Lchat-Conn-Id") != "" {
		s.handleHeldWS(w, r, last)
		return
	}
	// Hijacked connections are invisible to http.Server.Shutdown; count them
	// so the database is not closed under them.
	if !s.streams.add() {
		writeError(w, http.StatusServiceUnavailable, errClosed.Error())
		return
	}
	defer s.streams.done()

	sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)
	backlog, ok := s.backlog(w, r, last)
	if !ok {
		return
	}

	tick := s.clock.NewTicker(s.keepalive)
	defer tick.Stop()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept has answered the client
	}
	defer c.CloseNow()
	ctx := c.CloseRead(context.Background())

	send := func(m Message) bool {
		if m.ID <= last {
			return true
		}
		last = m.ID
		wctx, cancel := context.WithTimeout(ctx, streamWriteTimeout)
		defer cancel()
		return wsjson.Write(wctx, c, m) == nil
	}
	for _, m := range backlog {
		if !send(m) {
			return
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			c.Close(websocket.StatusGoingAway, "server shutting down")
			return
		case m, ok := <-sub:
			if !ok {
				c.Close(websocket.StatusTryAgainLater, "client too slow")
				return
			}
			if !send(m) {
				return
			}
		case <-tick.C():
			pctx, cancel := context.WithTimeout(ctx, streamWriteTimeout)
			err := c.Ping(pctx)
			cancel()
			if err != nil {
				return
			}
		}
	}
}

// streamGroup counts hijacked connections and refuses new ones once closed.
type streamGroup struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (g *streamGroup) add() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

func (g *streamGroup) done() { g.wg.Done() }

// closeAndWait refuses new streams and waits for the open ones to end, or
// for ctx.
func (g *streamGroup) closeAndWait(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	ch := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(ch)
	}()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
