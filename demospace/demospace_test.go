package demospace

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"go.uber.org/zap/zaptest"
)

var t0 = time.Date(2030, 5, 6, 7, 0, 0, 0, time.UTC)

// space is one in-process demo space on a temporary Unix socket.
type space struct {
	t       *testing.T
	sock    string
	dataDir string
	clock   *fakeClock
	srv     *Server
	stop    context.CancelFunc
	errc    chan error
	client  *http.Client
}

// shortTempDir returns a directory with a path short enough for a Unix
// socket (t.TempDir paths can pass the 108-byte limit).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func startSpace(t *testing.T, dataDir string, clk *fakeClock) *space {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "s.sock")
	return startSpaceAt(t, sock, dataDir, clk)
}

// startSpaceAt starts a space on sock; opts change its Config (Hold, say).
func startSpaceAt(t *testing.T, sock, dataDir string, clk *fakeClock, opts ...func(*Config)) *space {
	t.Helper()
	cfg := Config{Socket: sock, DataDir: dataDir, Host: "8oe.example.com", clock: clk, Logger: zaptest.NewLogger(t)}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &space{t: t, sock: sock, dataDir: dataDir, clock: clk, srv: srv, stop: cancel,
		errc: make(chan error, 1), client: unixClient(sock)}
	go func() { s.errc <- srv.Serve(ctx) }()
	t.Cleanup(func() { s.shutdown() })
	return s
}

// shutdown stops the space as SIGTERM would and returns Serve's result.
func (s *space) shutdown() error {
	s.t.Helper()
	s.stop()
	s.client.CloseIdleConnections()
	select {
	case err, ok := <-s.errc:
		if ok {
			close(s.errc)
		}
		return err
	case <-time.After(20 * time.Second):
		s.t.Fatal("Serve did not return after shutdown")
		return nil
	}
}

func (s *space) do(method, path, contentType, body string, hdr ...string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, "http://space.test"+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp.StatusCode, string(b)
}

func (s *space) postMessage(author, text string) Message {
	s.t.Helper()
	b, _ := json.Marshal(messageInput{Author: author, Text: text})
	code, body := s.do("POST", "/api/messages", "application/json", string(b))
	if code != http.StatusCreated {
		s.t.Fatalf("POST /api/messages = %d %s, want 201", code, body)
	}
	var m Message
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		s.t.Fatalf("decoding message %q: %v", body, err)
	}
	return m
}

func (s *space) messages() []Message {
	s.t.Helper()
	code, body := s.do("GET", "/api/messages", "", "")
	if code != http.StatusOK {
		s.t.Fatalf("GET /api/messages = %d %s", code, body)
	}
	var ms []Message
	if err := json.Unmarshal([]byte(body), &ms); err != nil {
		s.t.Fatalf("decoding messages %q: %v", body, err)
	}
	return ms
}

// TestHealthTakesNoConnection: the box's readiness probe (GET /healthz) arrives beside a
// wake's first request; with the first request holding the pool's connection it must not
// open a second SQLite connection (its open, pragmas and schema read cost about 1.5 ms of
// CPU at each wake).
func TestHealthTakesNoConnection(t *testing.T) {
	s := startSpace(t, t.TempDir(), newFakeClock(t0))
	ctx := context.Background()
	busy, err := s.srv.store.db.Conn(ctx) // the first request, holding the one connection
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if code, body := s.do("GET", "/healthz", "", ""); code != 200 || body != "ok" {
		t.Fatalf("GET /healthz = %d %q, want 200 ok", code, body)
	}
	if n := s.srv.store.db.Stats().OpenConnections; n != 1 {
		t.Fatalf("GET /healthz beside a busy connection left %d SQLite connections open, want 1", n)
	}
}

func TestEndpoints(t *testing.T) {
	s := startSpace(t, t.TempDir(), newFakeClock(t0))

	code, body := s.do("GET", "/healthz", "", "")
	if code != 200 || body != "ok" {
		t.Fatalf("GET /healthz = %d %q, want 200 ok", code, body)
	}
	if ms := s.messages(); len(ms) != 0 {
		t.Fatalf("fresh space has messages: %+v", ms)
	}

	m := s.postMessage("  ada ", "hello <b>world</b>")
	if m.ID <= 0 || m.Author != "ada" || m.Text != "hello <b>world</b>" || m.Kind != KindUser || !m.CreatedAt.Equal(t0) {
		t.Fatalf("posted message = %+v", m)
	}
	anon := s.postMessage("", "second")
	if anon.Author != "anonymous" || anon.ID <= m.ID {
		t.Fatalf("anonymous message = %+v", anon)
	}
	ms := s.messages()
	if len(ms) != 2 || ms[0] != m || ms[1] != anon {
		t.Fatalf("GET /api/messages = %+v, want [%+v %+v]", ms, m, anon)
	}

	code, body = s.do("GET", "/api/messages?after=1", "", "")
	if code != 200 || !strings.Contains(body, `"second"`) || strings.Contains(body, "hello") {
		t.Fatalf("GET /api/messages?after=1 = %d %s", code, body)
	}
	code, body = s.do("GET", "/api/messages?limit=1", "", "")
	if code != 200 || !strings.Contains(body, `"second"`) || strings.Contains(body, "hello") {
		t.Fatalf("GET /api/messages?limit=1 = %d %s, want the latest message only", code, body)
	}

	code, body = s.do("GET", "/", "", "")
	if code != 200 {
		t.Fatalf("GET / = %d", code)
	}
	for _, want := range []string{"8oe.example.com", "hello &lt;b&gt;world&lt;/b&gt;", "/api/events", "<form"} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{"<b>world</b>", `src="http`, `href="http`, "//cdn"} {
		if strings.Contains(body, bad) {
			t.Errorf("page contains %q (unescaped text or an external asset)", bad)
		}
	}

	// A plain form post (no JavaScript) stores the message and returns to the page.
	req, _ := http.NewRequest("POST", "http://space.test/api/messages", strings.NewReader("author=bob&text=from+a+form"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	client := unixClient(s.sock)
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("form post = %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	if ms := s.messages(); len(ms) != 3 || ms[2].Author != "bob" || ms[2].Text != "from a form" {
		t.Fatalf("after form post: %+v", ms)
	}

	// A browser on another site cannot post into the room.
	code, _ = s.do("POST", "/api/messages", "application/json", `{"text":"csrf"}`,
		"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
	if code != http.StatusForbidden {
		t.Fatalf("cross-site POST = %d, want 403", code)
	}
	if n := len(s.messages()); n != 3 {
		t.Fatalf("cross-site POST stored a message: %d messages", n)
	}

	code, _ = s.do("DELETE", "/api/messages", "", "")
	if code != http.StatusMethodNotAllowed {
		t.Fatalf("DELETE /api/messages = %d, want 405", code)
	}
}

func TestBadInputIsRejectedAndNotStored(t *testing.T) {
	s := startSpace(t, t.TempDir(), newFakeClock(t0))
	long := strings.Repeat("é", MaxTextRunes+1)
	tests := []struct {
		name, path, ctype, body string
		code                    int
		msg                     string
	}{
		{"malformed", "/api/messages", "application/json", `{"text": "hi"`, 400, "malformed JSON"},
		{"syntax", "/api/messages", "application/json", `{text: hi}`, 400, "malformed JSON at byte"},
		{"empty body", "/api/messages", "application/json", ``, 400, "empty"},
		{"not an object", "/api/messages", "application/json", `["hi"]`, 400, "malformed JSON"},
		{"wrong type", "/api/messages", "application/json", `{"text": 5}`, 400, `"text" must be a string`},
		{"unknown field", "/api/messages", "application/json", `{"text": "hi", "admin": true}`, 400, "unknown field"},
		{"two objects", "/api/messages", "application/json", `{"text": "a"} {"text": "b"}`, 400, "single JSON object"},
		{"trailing garbage", "/api/messages", "application/json", `{"text": "a"}}`, 400, "malformed JSON"},
		{"no text", "/api/messages", "application/json", `{"author": "ada"}`, 400, "text is required"},
		{"blank text", "/api/messages", "application/json", `{"text": " \n\t "}`, 400, "text is required"},
		{"text too long", "/api/messages", "application/json", `{"text": "` + long + `"}`, 400, "limit is 2000"},
		{"author too long", "/api/messages", "application/json", `{"author": "` + strings.Repeat("a", MaxAuthorRunes+1) + `", "text": "x"}`, 400, "limit is 64"},
		{"control chars", "/api/messages", "application/json", `{"author": "a\u0007", "text": "x"}`, 400, "control characters"},
		{"body too large", "/api/messages", "application/json", `{"text": "` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, "larger than"},
		{"wrong content type", "/api/messages", "text/plain", `{"text": "hi"}`, 415, "application/json"},
		{"reminder no at", "/api/reminders", "application/json", `{"text": "x"}`, 400, "at is required"},
		{"reminder bad at", "/api/reminders", "application/json", `{"at": "tomorrow", "text": "x"}`, 400, "RFC 3339"},
		{"reminder no text", "/api/reminders", "application/json", `{"at": "2030-01-01T00:00:00Z"}`, 400, "text is required"},
		{"reminder malformed", "/api/reminders", "application/json", `{"at": `, 400, "malformed JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := s.do("POST", tt.path, tt.ctype, tt.body)
			if code != tt.code {
				t.Fatalf("status = %d (%s), want %d", code, body, tt.code)
			}
			var e apiError
			if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error, tt.msg) {
				t.Fatalf("body = %s, want a JSON error containing %q", body, tt.msg)
			}
		})
	}
	if ms := s.messages(); len(ms) != 0 {
		t.Fatalf("bad input stored messages: %+v", ms)
	}
	code, body := s.do("GET", "/api/reminders", "", "")
	if code != 200 || !strings.Contains(body, `"pending":[]`) {
		t.Fatalf("bad input stored reminders: %d %s", code, body)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, NextWakePath)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("next-wake exists after rejected reminders: %v", err)
	}

	// The limits are inclusive.
	m := s.postMessage(strings.Repeat("a", MaxAuthorRunes), strings.Repeat("é", MaxTextRunes))
	if len([]rune(m.Text)) != MaxTextRunes {
		t.Fatalf("text at the limit was altered: %d runes", len([]rune(m.Text)))
	}
}

// sseStream reads server-sent events.
type sseStream struct {
	t    *testing.T
	body io.ReadCloser
	r    *bufio.Reader
	// opened is the first block: the connected comment, and the stream's position when
	// it opened with none.
	opened sseEvent
}

type sseEvent struct {
	id, event, data string
	comments        []string
}

func openEvents(t *testing.T, s *space, path string, hdr ...string) *sseStream {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://space.test"+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("GET /api/events: %v", err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /api/events = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	st := &sseStream{t: t, body: resp.Body, r: bufio.NewReader(resp.Body)}
	t.Cleanup(func() { resp.Body.Close() })
	if st.opened = st.next(); len(st.opened.comments) == 0 || st.opened.comments[0] != "connected" {
		t.Fatalf("first event = %+v, want the connected comment", st.opened)
	}
	return st
}

// next reads one event block (up to a blank line). It fails the test if
// nothing arrives within a generous bound, instead of hanging.
func (st *sseStream) next() sseEvent {
	st.t.Helper()
	type res struct {
		ev  sseEvent
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var ev sseEvent
		for {
			line, err := st.r.ReadString('\n')
			if err != nil {
				ch <- res{ev, err}
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				ch <- res{ev, nil}
				return
			case strings.HasPrefix(line, ":"):
				ev.comments = append(ev.comments, strings.TrimSpace(line[1:]))
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			st.t.Fatalf("reading event stream: %v", r.err)
		}
		return r.ev
	case <-time.After(10 * time.Second):
		st.t.Fatal("no event within 10s")
		return sseEvent{}
	}
}

// nextMessage reads the next message event, skipping keepalive comments.
func (st *sseStream) nextMessage() Message {
	st.t.Helper()
	ev := st.next()
	for ev.event == "" && ev.data == "" && len(ev.comments) > 0 {
		ev = st.next()
	}
	var m Message
	if ev.event != "message" || json.Unmarshal([]byte(ev.data), &m) != nil || ev.id == "" {
		st.t.Fatalf("event = %+v, want a message event", ev)
	}
	return m
}

func TestEventsStreamMessagesKeepaliveAndResume(t *testing.T) {
	clk := newFakeClock(t0)
	s := startSpace(t, t.TempDir(), clk)
	st := openEvents(t, s, "/api/events")

	posted := s.postMessage("ada", "live one")
	if got := st.nextMessage(); got != posted {
		t.Fatalf("SSE delivered %+v, want %+v", got, posted)
	}

	// The stream stays open and says so every keepalive interval.
	clk.Advance(DefaultKeepalive)
	if ev := st.next(); len(ev.comments) != 1 || ev.comments[0] != "keepalive" || ev.event != "" {
		t.Fatalf("after one keepalive interval got %+v, want a keepalive comment", ev)
	}

	second := s.postMessage("bob", "live two")
	if got := st.nextMessage(); got != second {
		t.Fatalf("SSE delivered %+v, want %+v", got, second)
	}

	// A reconnecting EventSource sends Last-Event-ID and gets what it missed.
	re := openEvents(t, s, "/api/events", "Last-Event-ID", "1")
	if got := re.nextMessage(); got != second {
		t.Fatalf("resumed stream delivered %+v, want %+v", got, second)
	}
	// The page's ?after= does the same for a first connection.
	pg := openEvents(t, s, "/api/events?after=0")
	for _, want := range []Message{posted, second} {
		if got := pg.nextMessage(); got != want {
			t.Fatalf("?after=0 stream delivered %+v, want %+v", got, want)
		}
	}
	code, _ := s.do("GET", "/api/events?after=x", "", "")
	if code != http.StatusBadRequest {
		t.Fatalf("GET /api/events?after=x = %d, want 400", code)
	}

	// Shutdown ends open streams instead of waiting for them forever.
	if err := s.shutdown(); err != nil {
		t.Fatalf("Serve = %v, want nil after a clean shutdown", err)
	}
	// A stream the handler ended ends cleanly; one cut by a forced close
	// would end with an unexpected EOF.
	if _, err := io.ReadAll(st.body); err != nil {
		t.Fatalf("event stream ended with %v, want a clean end at shutdown", err)
	}
	if n := clk.liveTickers(); n != 0 {
		t.Fatalf("%d keepalive tickers still running after shutdown", n)
	}
}

// A stream opened with no position carries one from its first block (an id with no
// data, which sets a client's last event id): reopened with it, as the box does when the
// space wakes (the request that woke it may post before the stream is reopened) or a
// browser after a drop, it gets every message posted since it opened, none from before.
func TestEventsStreamStartsWhereItOpened(t *testing.T) {
	clk := newFakeClock(t0)
	s := startSpace(t, t.TempDir(), clk)
	empty := openEvents(t, s, "/api/events")
	if empty.opened.id != "0" || empty.opened.data != "" || empty.opened.event != "" {
		t.Fatalf("first block of a stream on an empty room = %+v, want id 0 and no data", empty.opened)
	}
	before := s.postMessage("ada", "before the stream")
	st := openEvents(t, s, "/api/events")
	if want := strconv.FormatInt(before.ID, 10); st.opened.id != want || st.opened.data != "" {
		t.Fatalf("first block = %+v, want id %s and no data", st.opened, want)
	}
	st.body.Close() // the client goes; a message is posted before it comes back
	missed := s.postMessage("bob", "while the stream was down")
	re := openEvents(t, s, "/api/events", "Last-Event-ID", st.opened.id)
	if got := re.nextMessage(); got != missed {
		t.Fatalf("reopened stream delivered %+v, want %+v (and not %+v)", got, missed, before)
	}
	if re.opened.id != "" {
		t.Fatalf("a resumed stream's first block has id %q; it has its position already", re.opened.id)
	}
}

func TestWebSocket(t *testing.T) {
	clk := newFakeClock(t0)
	s := startSpace(t, t.TempDir(), clk)
	first := s.postMessage("ada", "before connect")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://space.test/api/ws?after=0", &websocket.DialOptions{HTTPClient: unixClient(s.sock)})
	if err != nil {
		t.Fatalf("dialing /api/ws: %v", err)
	}
	defer c.CloseNow()

	var got Message
	if err := wsjson.Read(ctx, c, &got); err != nil || got != first {
		t.Fatalf("backlog over WebSocket = %+v, %v; want %+v", got, err, first)
	}
	posted := s.postMessage("bob", "over the socket")
	if err := wsjson.Read(ctx, c, &got); err != nil || got != posted {
		t.Fatalf("WebSocket delivered %+v, %v; want %+v", got, err, posted)
	}

	// Shutdown closes the WebSocket with "going away" and does not hang on it.
	done := make(chan error, 1)
	go func() { done <- s.shutdown() }()
	_, _, err = c.Read(ctx)
	if st := websocket.CloseStatus(err); st != websocket.StatusGoingAway {
		t.Fatalf("read after shutdown = %v (status %d), want StatusGoingAway", err, st)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}

func readNextWake(t *testing.T, dataDir string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, NextWakePath))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func TestRemindersAndScheduledWake(t *testing.T) {
	dataDir := t.TempDir()
	clk := newFakeClock(t0)
	s := startSpace(t, dataDir, clk)
	if _, ok := readNextWake(t, dataDir); ok {
		t.Fatal("next-wake exists with no reminders")
	}

	// Two reminders, posted out of order: next-wake holds the earliest.
	for _, r := range []struct{ at, text string }{
		{t0.Add(2 * time.Hour).Format(time.RFC3339), "standup"},
		{t0.Add(time.Hour).Add(500 * time.Millisecond).Format(time.RFC3339Nano), "coffee"},
	} {
		code, body := s.do("POST", "/api/reminders", "application/json", `{"at":"`+r.at+`","text":"`+r.text+`"}`)
		if code != http.StatusCreated {
			t.Fatalf("POST /api/reminders = %d %s", code, body)
		}
	}
	wantFirst := t0.Add(time.Hour).Format(time.RFC3339)
	if got, _ := readNextWake(t, dataDir); got != wantFirst {
		t.Fatalf("next-wake = %q, want %q", got, wantFirst)
	}
	code, body := s.do("GET", "/api/reminders", "", "")
	var list reminderList
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Pending) != 2 ||
		list.Pending[0].Text != "coffee" || list.NextWake == nil || !list.NextWake.Equal(t0.Add(time.Hour)) {
		t.Fatalf("GET /api/reminders = %d %s", code, body)
	}

	// The space goes to sleep before the reminder is due; next-wake stays.
	if err := s.shutdown(); err != nil {
		t.Fatal(err)
	}
	if got, _ := readNextWake(t, dataDir); got != wantFirst {
		t.Fatalf("next-wake after stop = %q, want %q", got, wantFirst)
	}

	// The proxy starts it when due and posts the scheduled wake.
	clk2 := newFakeClock(t0.Add(time.Hour + 10*time.Second))
	s2 := startSpace(t, dataDir, clk2)
	if n := len(s2.messages()); n != 0 {
		t.Fatalf("reminder fired before the wake request: %d messages", n)
	}
	code, body = s2.do("POST", "/", "", "", WakeReasonHeader, "scheduled")
	var res wakeResult
	if code != 200 || json.Unmarshal([]byte(body), &res) != nil || res.Fired != 1 || res.Reason != "scheduled" ||
		res.NextWake == nil || !res.NextWake.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("scheduled wake = %d %s, want 200 with one reminder fired", code, body)
	}
	ms := s2.messages()
	if len(ms) != 1 || ms[0].Kind != KindSystem || ms[0].Text != "Reminder: coffee" || ms[0].Author != systemAuthor {
		t.Fatalf("messages after the wake = %+v, want the system reminder", ms)
	}
	if got, _ := readNextWake(t, dataDir); got != t0.Add(2*time.Hour).Format(time.RFC3339) {
		t.Fatalf("next-wake after the wake = %q, want the second reminder", got)
	}

	// A repeated wake (the proxy retries) posts nothing twice.
	code, body = s2.do("POST", "/api/wake", "", "", WakeReasonHeader, "scheduled")
	if code != 200 || !strings.Contains(body, `"fired":0`) {
		t.Fatalf("second wake = %d %s", code, body)
	}
	// POST / is for wakes only.
	if code, _ := s2.do("POST", "/", "", ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST / without a wake reason = %d, want 405", code)
	}

	// While awake, a reminder that falls due is delivered by the space itself,
	// to open streams too.
	st := openEvents(t, s2, "/api/events")
	clk2.Advance(time.Hour)
	if m := st.nextMessage(); m.Text != "Reminder: standup" || m.Kind != KindSystem {
		t.Fatalf("SSE after the second reminder = %+v", m)
	}
	if got, ok := readNextWake(t, dataDir); ok {
		t.Fatalf("next-wake = %q with no reminders pending, want it removed", got)
	}
	if n := clk2.pendingTimers(); n != 0 {
		t.Fatalf("%d reminder timers armed with nothing pending", n)
	}
	if ms := s2.messages(); len(ms) != 2 {
		t.Fatalf("messages = %+v, want both reminders once", ms)
	}
}

func TestDueReminderFiresAfterStartupGraceWithoutWake(t *testing.T) {
	dataDir := t.TempDir()
	s := startSpace(t, dataDir, newFakeClock(t0))
	code, body := s.do("POST", "/api/reminders", "application/json", `{"at":"`+t0.Add(time.Minute).Format(time.RFC3339)+`","text":"late"}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /api/reminders = %d %s", code, body)
	}
	if err := s.shutdown(); err != nil {
		t.Fatal(err)
	}

	// Started for another reason after the reminder fell due, and no
	// scheduled wake arrives: the space delivers it itself after the grace.
	clk := newFakeClock(t0.Add(time.Hour))
	s2 := startSpace(t, dataDir, clk)
	clk.Advance(startupGrace - time.Second)
	if n := len(s2.messages()); n != 0 {
		t.Fatalf("reminder fired inside the startup grace")
	}
	clk.Advance(time.Second)
	if ms := s2.messages(); len(ms) != 1 || ms[0].Text != "Reminder: late" {
		t.Fatalf("messages after the grace = %+v", ms)
	}
	if _, ok := readNextWake(t, dataDir); ok {
		t.Fatal("next-wake not removed")
	}
}

func TestRestartKeepsMessages(t *testing.T) {
	dataDir := t.TempDir()
	s := startSpace(t, dataDir, newFakeClock(t0))
	var want []Message
	for _, text := range []string{"one", "two", "three"} {
		want = append(want, s.postMessage("ada", text))
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	// A clean close folds the WAL back into chat.db: one file to snapshot.
	if _, err := os.Stat(filepath.Join(dataDir, DBFile+"-wal")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("chat.db-wal left after a clean stop: %v", err)
	}
	if _, err := os.Stat(s.sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after stop: %v", err)
	}

	// Only chat.db survives, as after a restore from the bucket.
	s2 := startSpace(t, dataDir, newFakeClock(t0.Add(time.Hour)))
	got := s2.messages()
	if len(got) != len(want) {
		t.Fatalf("after restart: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("after restart message %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if next := s2.postMessage("bob", "four"); next.ID <= want[2].ID {
		t.Fatalf("new message id %d reuses an old one", next.ID)
	}
}

func TestSocketFile(t *testing.T) {
	dir := shortTempDir(t)

	// A socket file left by a crashed instance is removed.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	s := startSpaceAt(t, stale, t.TempDir(), newFakeClock(t0))
	if code, _ := s.do("GET", "/healthz", "", ""); code != 200 {
		t.Fatalf("healthz on a reclaimed socket = %d", code)
	}

	// A live socket is not stolen, and a regular file is never removed.
	if _, err := New(Config{Socket: stale, DataDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("New on a live socket = %v, want an in-use error", err)
	}
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Socket: regular, DataDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("New on a regular file = %v, want a not-a-socket error", err)
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep" {
		t.Fatalf("regular file touched: %q %v", b, err)
	}

	for _, cfg := range []Config{{DataDir: t.TempDir()}, {Socket: filepath.Join(dir, "x.sock")}} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("New(%+v) succeeded without socket or data dir", cfg)
		}
	}
}

// TestSnapshotWhileWriting does what the hibernation engine does to a running
// space: VACUUM INTO from its own connection while the app writes. The
// snapshot must be a sound database holding every message committed before it.
func TestSnapshotWhileWriting(t *testing.T) {
	dataDir := t.TempDir()
	s := startSpace(t, dataDir, newFakeClock(t0))
	for i := 0; i < 20; i++ {
		s.postMessage("ada", "before")
	}

	stop := make(chan struct{})
	writing := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c := unixClient(s.sock)
		for n := 0; ; n++ {
			if n == 1 {
				close(writing)
			}
			select {
			case <-stop:
				return
			default:
			}
			resp, err := c.Post("http://space.test/api/messages", "application/json", strings.NewReader(`{"text":"during"}`))
			if err != nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("POST during snapshot = %d", resp.StatusCode)
				return
			}
		}
	}()

	select {
	case <-writing:
	case <-writerDone:
		t.Fatal("writer stopped before the snapshot")
	}
	// The same DSN the engine's snapshot (space/sync.go) opens.
	engine, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, DBFile)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	snap := filepath.Join(t.TempDir(), "snap.db")
	if _, err := engine.Exec(`VACUUM INTO ?`, snap); err != nil {
		t.Fatalf("VACUUM INTO while the space writes: %v", err)
	}
	close(stop)
	<-writerDone

	db, err := sql.Open("sqlite", "file:"+snap+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var check string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("snapshot integrity_check = %q, %v", check, err)
	}
	var before, maxID int
	if err := db.QueryRow(`SELECT COUNT(*) FROM messages WHERE text = 'before'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if before != 20 {
		t.Fatalf("snapshot holds %d of the 20 messages committed before it", before)
	}
	if err := db.QueryRow(`SELECT COUNT(*) = MAX(id) FROM messages`).Scan(&maxID); err != nil || maxID != 1 {
		t.Fatalf("snapshot has gaps in message ids (a torn copy): %v", err)
	}
}

// TestRoomSaysWhatItIs: the room's page says what the demo shows (that the space sleeps,
// and, when the box holds its connections, that open tabs stay connected meanwhile), and
// an empty room says it has no messages yet, a line that goes with the first message.
func TestRoomSaysWhatItIs(t *testing.T) {
	visible := func(page string) bool {
		return strings.Contains(page, `<p id="empty">No messages yet.`)
	}
	s := startSpace(t, t.TempDir(), newFakeClock(t0))
	code, page := s.do("GET", "/", "", "")
	if code != 200 || !visible(page) || !strings.Contains(page, "sleeps when nobody uses it") {
		t.Fatalf("GET / of an empty room = %d, want the empty line shown and what the demo is:\n%s", code, page)
	}
	if !strings.Contains(page, "A tab left open keeps it awake.") || strings.Contains(page, "stay connected") {
		t.Errorf("a room whose connections the box does not hold claims tabs stay connected while it sleeps:\n%s", page)
	}
	s.postMessage("ada", "first")
	if _, page = s.do("GET", "/", "", ""); visible(page) || !strings.Contains(page, `<p id="empty" hidden>`) {
		t.Errorf("the empty line is still shown after the first message:\n%s", page)
	}

	held := startSpaceAt(t, filepath.Join(shortTempDir(t), "s.sock"), t.TempDir(), newFakeClock(t0), func(c *Config) { c.Hold = true })
	if _, page = held.do("GET", "/", "", ""); !visible(page) || !strings.Contains(page, "Open tabs stay connected while it sleeps") {
		t.Errorf("a room whose connections the box holds does not say its tabs stay connected:\n%s", page)
	}
}
