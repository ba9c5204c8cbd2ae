package held

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/connhold"
)

// client is the client's side of a writer: a ResponseRecorder that also keeps the
// informational statuses passed on before the answer (the recorder would take a 1xx
// for the answer) and counts the final statuses written.
type client struct {
	*httptest.ResponseRecorder
	informational []int
	finals        int
}

func newClient() *client { return &client{ResponseRecorder: httptest.NewRecorder()} }

func (c *client) WriteHeader(code int) {
	if code < 200 && code != http.StatusSwitchingProtocols {
		c.informational = append(c.informational, code)
		return
	}
	c.finals++
	c.ResponseRecorder.WriteHeader(code)
}

// untouched reports whether nothing of an answer reached the client.
func (c *client) untouched() bool {
	return c.finals == 0 && c.Body.Len() == 0 && !c.Flushed && len(c.informational) == 0
}

// answer is an instance's answer as a reverse proxy writes it: its header, an optional
// informational status before it, its status, its body, and a flush.
type answer struct {
	early  int // an informational status first; 0: none
	status int // 0: none written before the body (an implicit 200)
	header http.Header
	body   string
}

func (a answer) writeTo(w http.ResponseWriter) {
	if a.early != 0 {
		w.WriteHeader(a.early)
	}
	for k, vs := range a.header {
		w.Header()[k] = vs
	}
	if a.status != 0 {
		w.WriteHeader(a.status)
	}
	if a.body != "" {
		w.Write([]byte(a.body))
	}
	w.(http.Flusher).Flush()
}

// TestHoldWriter: an instance's answer to an upgrade that opts in (2xx and Lchat-Ws:
// hold) is kept, status, header and body, and nothing of it reaches the client, whose
// handshake the box completes itself; any other answer (a 101 and its tunnel included)
// reaches the client as it is; an informational status is passed on either way.
func TestHoldWriter(t *testing.T) {
	hold := func(kv ...string) http.Header {
		h := http.Header{connhold.HoldHeader: {connhold.HoldValue}}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name  string
		a     answer
		held  bool
		early []int // informational statuses the client gets
	}{
		{name: "opt-in 200 with a welcome", held: true,
			a: answer{status: 200, header: hold(connhold.SetTagsHeader, "room-1"), body: "welcome"}},
		{name: "opt-in 201, mark spelled loosely", held: true,
			a: answer{status: 201, header: http.Header{connhold.HoldHeader: {" HOLD "}}}},
		{name: "opt-in without a status (an implicit 200)", held: true, a: answer{header: hold(), body: "hi"}},
		{name: "early hints, then an opt-in", held: true, early: []int{103},
			a: answer{early: 103, status: 200, header: hold()}},
		{name: "101 with the mark: the tunnel", a: answer{status: 101, header: hold("Upgrade", "websocket")}},
		{name: "403 with the mark", a: answer{status: 403, header: hold(), body: "no"}},
		{name: "200 without the mark", a: answer{status: 200, header: http.Header{"X-App": {"1"}}, body: "plain"}},
		{name: "200 with another mark", a: answer{status: 200, header: http.Header{connhold.HoldHeader: {"keep"}}, body: "x"}},
		{name: "continue, then a refusal", early: []int{100}, a: answer{early: 100, status: 401, body: "who"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient()
			hw := NewHoldWriter(c)
			tc.a.writeTo(hw)
			if hw.Held() != tc.held {
				t.Fatalf("Held = %v, want %v", hw.Held(), tc.held)
			}
			if !slices.Equal(c.informational, tc.early) {
				t.Errorf("informational statuses at the client: %v, want %v", c.informational, tc.early)
			}
			c.informational = nil
			wantStatus := tc.a.status
			if wantStatus == 0 {
				wantStatus = http.StatusOK
			}
			if tc.held {
				status, header, body := hw.Answer()
				if status != wantStatus || string(body) != tc.a.body {
					t.Errorf("kept answer %d %q, want %d %q", status, body, wantStatus, tc.a.body)
				}
				for k := range tc.a.header {
					if header.Get(k) != tc.a.header.Get(k) {
						t.Errorf("kept header %s = %q, want %q", k, header.Get(k), tc.a.header.Get(k))
					}
				}
				if !c.untouched() {
					t.Errorf("the client got %d status(es), %q, flushed %v", c.finals, c.Body, c.Flushed)
				}
				return
			}
			if c.finals != 1 || c.Code != wantStatus || c.Body.String() != tc.a.body {
				t.Errorf("the client got %d status(es), %d %q; want %d %q", c.finals, c.Code, c.Body, wantStatus, tc.a.body)
			}
			for k := range tc.a.header {
				if got := c.Result().Header.Get(k); got != tc.a.header.Get(k) {
					t.Errorf("client header %s = %q, want %q", k, got, tc.a.header.Get(k))
				}
			}
			if !c.Flushed {
				t.Error("a flush of an answer passed through did not reach the client")
			}
		})
	}
}

// TestHoldWriterBoundsTheOptIn: an opt-in answer's body is kept up to connhold.MaxAnswer
// (the largest message a client can be sent); a write past it is refused and keeps
// nothing of it.
func TestHoldWriterBoundsTheOptIn(t *testing.T) {
	c := newClient()
	hw := NewHoldWriter(c)
	hw.Header().Set(connhold.HoldHeader, connhold.HoldValue)
	hw.WriteHeader(http.StatusOK)
	if n, err := hw.Write(bytes.Repeat([]byte{'a'}, connhold.MaxAnswer-1)); err != nil || n != connhold.MaxAnswer-1 {
		t.Fatalf("writing MaxAnswer-1 bytes: %d, %v", n, err)
	}
	if n, err := hw.Write([]byte("bc")); err == nil || n != 0 {
		t.Fatalf("writing past MaxAnswer: %d, %v; want 0 and an error", n, err)
	}
	if n, err := hw.Write([]byte("b")); err != nil || n != 1 {
		t.Fatalf("writing the last byte: %d, %v", n, err)
	}
	if _, _, body := hw.Answer(); len(body) != connhold.MaxAnswer || body[len(body)-1] != 'b' {
		t.Fatalf("kept %d bytes, want MaxAnswer ending in the last byte written", len(body))
	}
	if !c.untouched() {
		t.Fatalf("the client got %d status(es), %d bytes", c.finals, c.Body.Len())
	}
}

// sseHeader is an event stream's header; resumable marks it so (connhold.Resumable).
func sseHeader(resumable bool, app string) http.Header {
	h := http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}, "X-App": {app}}
	if resumable {
		h.Set(connhold.SSEHeader, connhold.SSEResumable)
	}
	return h
}

// TestSSEWriterPassesThrough: an answer to a request for events that is not a resumable
// stream reaches the client byte for byte, half events included, with its header (the
// Lchat-Sse mark aside), its use kept (release not called), and is not the box's to hold.
func TestSSEWriterPassesThrough(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		header http.Header
	}{
		{name: "stream without the mark", status: 200, header: sseHeader(false, "a")},
		{name: "201 with the mark", status: 201, header: sseHeader(true, "a")},
		{name: "page with the mark", status: 200, header: http.Header{"Content-Type": {"text/html"},
			connhold.SSEHeader: {connhold.SSEResumable}, "X-App": {"a"}}},
		{name: "404", status: 404, header: http.Header{"X-App": {"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient()
			released := 0
			sw := NewSSEWriter(c, func() { released++ })
			for k, vs := range tc.header {
				sw.Header()[k] = vs
			}
			sw.WriteHeader(tc.status)
			chunks := []string{"id: 1\ndata: a", "\n\nid: 2\n", "data: half"}
			for _, b := range chunks {
				if n, err := sw.Write([]byte(b)); err != nil || n != len(b) {
					t.Fatalf("Write(%q) = %d, %v", b, n, err)
				}
			}
			sw.Flush()
			if want := strings.Join(chunks, ""); c.Code != tc.status || c.Body.String() != want {
				t.Errorf("the client got %d %q, want %d %q", c.Code, c.Body, tc.status, want)
			}
			got := c.Result().Header
			if got.Get("X-App") != "a" || got.Get("Content-Type") != tc.header.Get("Content-Type") {
				t.Errorf("the client's header %v lacks the answer's %v", got, tc.header)
			}
			if v, ok := got[connhold.SSEHeader]; ok {
				t.Errorf("the mark reached the client: %q", v)
			}
			if released != 0 || sw.ToHold() || !sw.Sent() || !c.Flushed {
				t.Errorf("released %d times, ToHold %v, Sent %v, flushed %v; want 0, false, true, true",
					released, sw.ToHold(), sw.Sent(), c.Flushed)
			}
			if status, resumable := sw.Answer(); status != tc.status || resumable {
				t.Errorf("Answer = %d, %v", status, resumable)
			}
		})
	}
}

// TestSSEWriterResumable: a resumable stream releases its use once, reaches the client at
// once (an EventSource opens before the first event), event by event however the proxy
// cuts the bytes, and carries the Lchat-Sse mark only to an entry box (KeepMark). Reopened
// on a second answer, the second answer's header stays off the client's response, its use
// is released once, and its events continue the same response: the half event the first
// instance ended on is dropped, and LastID follows the events the client got.
func TestSSEWriterResumable(t *testing.T) {
	for _, keepMark := range []bool{false, true} {
		name := "to a client"
		if keepMark {
			name = "to an entry box"
		}
		t.Run(name, func(t *testing.T) {
			c := newClient()
			first, second := 0, 0
			sw := NewSSEWriter(c, func() { first++ })
			if keepMark {
				sw.KeepMark()
			}
			for k, vs := range sseHeader(true, "first") {
				sw.Header()[k] = vs
			}
			sw.WriteHeader(http.StatusOK)
			sw.Flush()
			if first != 1 || !sw.ToHold() || c.Code != http.StatusOK || !c.Flushed {
				t.Fatalf("after the header: released %d times, ToHold %v, client %d flushed %v",
					first, sw.ToHold(), c.Code, c.Flushed)
			}
			hdr := c.Result().Header
			if got := hdr.Get(connhold.SSEHeader); (got == connhold.SSEResumable) != keepMark {
				t.Errorf("the client's %s = %q with KeepMark %v", connhold.SSEHeader, got, keepMark)
			}
			if hdr.Get("X-App") != "first" {
				t.Errorf("the client's header %v lacks the answer's", hdr)
			}

			const ev1, ev2 = "id: 1\ndata: a\n\n", "data: no id\r\n\r\n"
			stream := ev1 + ev2 + "id: 3\ndata: cut by the instance's end"
			for i := range len(stream) {
				if n, err := sw.Write([]byte{stream[i]}); err != nil || n != 1 {
					t.Fatalf("writing byte %d: %d, %v", i, n, err)
				}
				if got := c.Body.String(); got != "" && got != ev1 && got != ev1+ev2 {
					t.Fatalf("after %d bytes the client has %q: not whole events", i+1, got)
				}
			}
			if got := c.Body.String(); got != ev1+ev2 {
				t.Fatalf("the client has %q, want %q", got, ev1+ev2)
			}
			if id, ok := sw.LastID(); !ok || id != "1" {
				t.Fatalf("LastID = %q, %v; want 1", id, ok)
			}

			sw.Reopen(func() { second++ })
			if status, resumable := sw.Answer(); status != 0 || resumable {
				t.Fatalf("after Reopen, Answer = %d, %v; want 0, false", status, resumable)
			}
			for k, vs := range sseHeader(true, "second") {
				sw.Header()[k] = vs
			}
			sw.Header().Set("Set-Cookie", "s=2")
			sw.WriteHeader(http.StatusOK)
			sw.WriteHeader(http.StatusOK)
			const ev4 = "id: 4\ndata: d\n\n"
			sw.Write([]byte(ev4))
			if first != 1 || second != 1 {
				t.Errorf("released %d and %d times, want once each", first, second)
			}
			if status, resumable := sw.Answer(); status != http.StatusOK || !resumable || !sw.ToHold() {
				t.Errorf("Answer = %d, %v, ToHold %v after a resumable reopen", status, resumable, sw.ToHold())
			}
			if c.finals != 1 || c.Header().Get("X-App") != "first" || c.Header().Get("Set-Cookie") != "" {
				t.Errorf("the second answer's header reached the client: %d statuses, %v", c.finals, c.Header())
			}
			if got := c.Body.String(); got != ev1+ev2+ev4 {
				t.Errorf("the client has %q, want %q", got, ev1+ev2+ev4)
			}
			if id, ok := sw.LastID(); !ok || id != "4" {
				t.Errorf("LastID = %q, %v; want 4", id, ok)
			}
		})
	}
}

// TestSSEWriterReopenAnsweredOtherwise: a reopen answered with anything but a resumable
// stream (the instance ends the stream) adds nothing to the client's response, keeps the
// second use, and the stream is no longer the box's to hold.
func TestSSEWriterReopenAnsweredOtherwise(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		header http.Header
	}{
		{name: "204", status: 204, header: http.Header{}},
		{name: "stream without the mark", status: 200, header: sseHeader(false, "second")},
		{name: "page", status: 200, header: http.Header{"Content-Type": {"text/html"}}},
		{name: "503 with the mark", status: 503, header: sseHeader(true, "second")},
		{name: "no status", header: sseHeader(false, "second")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient()
			sw := NewSSEWriter(c, func() {})
			for k, vs := range sseHeader(true, "first") {
				sw.Header()[k] = vs
			}
			sw.WriteHeader(http.StatusOK)
			const ev1 = "id: 1\ndata: a\n\n"
			sw.Write([]byte(ev1))

			second := 0
			sw.Reopen(func() { second++ })
			for k, vs := range tc.header {
				sw.Header()[k] = vs
			}
			if tc.status != 0 {
				sw.WriteHeader(tc.status)
			}
			b := []byte("id: 9\ndata: z\n\n")
			if n, err := sw.Write(b); err != nil || n != len(b) {
				t.Errorf("Write = %d, %v; the proxy must see its write taken", n, err)
			}
			sw.Flush()
			if c.finals != 1 || c.Code != http.StatusOK || c.Body.String() != ev1 || c.Header().Get("X-App") != "first" {
				t.Errorf("the client got %d status(es), %d %q, %v; want only the first answer",
					c.finals, c.Code, c.Body, c.Header())
			}
			if second != 0 || sw.ToHold() {
				t.Errorf("released %d times, ToHold %v; want 0, false", second, sw.ToHold())
			}
			wantStatus := tc.status
			if wantStatus == 0 {
				wantStatus = http.StatusOK // the proxy's first write
			}
			if status, resumable := sw.Answer(); status != wantStatus || resumable {
				t.Errorf("Answer = %d, %v", status, resumable)
			}
			if id, _ := sw.LastID(); id != "1" {
				t.Errorf("LastID = %q, want 1", id)
			}
		})
	}
}

// TestRefusedOptInLeavesNoHeader: an opt-in answer the box cannot hold a connection with
// (here a close code an app may not send) is refused 502, and the client's refusal
// carries nothing of the kept answer: not the instance's cookies, not the connection's
// metadata, not the hold mark.
func TestRefusedOptInLeavesNoHeader(t *testing.T) {
	conns := openConns(t, boxtest.Open(t, boxtest.Options{}))
	c := newClient()
	hw := NewHoldWriter(c)
	answer{status: 200, header: http.Header{
		connhold.HoldHeader:    {connhold.HoldValue},
		connhold.CloseHeader:   {"1005"},
		connhold.SetMetaHeader: {"c2VjcmV0"},
		"Set-Cookie":           {"s=1"},
	}}.writeTo(hw)
	if !hw.Held() {
		t.Fatal("the opt-in answer was not kept")
	}
	_, header, body := hw.Answer()
	r := peerRequest("GET", "/ws", handshake(), false)
	err := conns.Accept(c, r, "s1.example.com", connhold.NewID(), header, body)
	var be *box.Error
	if !errors.As(err, &be) || be.Status != http.StatusBadGateway {
		t.Fatalf("Accept = %v, want a *box.Error 502", err)
	}
	for _, k := range []string{connhold.HoldHeader, connhold.CloseHeader, connhold.SetMetaHeader, "Set-Cookie"} {
		if v, ok := c.Header()[k]; ok {
			t.Errorf("the refusal carries the instance's %s: %q", k, v)
		}
	}
}

// TestClientWriterTakesTheMarkOff: the Lchat-Sse mark goes out on no answer to a client,
// however the answer begins (a status, a body without one, a flush, a 1xx before it), and
// stays only on an answer to the entry box that holds the stream (keepMark).
func TestClientWriterTakesTheMarkOff(t *testing.T) {
	for _, tc := range []struct {
		name     string
		keepMark bool
		answer   func(w http.ResponseWriter)
	}{
		{"status", false, func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }},
		{"body alone", false, func(w http.ResponseWriter) { w.Write([]byte("x")) }},
		{"flush first", false, func(w http.ResponseWriter) { http.NewResponseController(w).Flush() }},
		{"early hints first", false, func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set(connhold.SSEHeader, connhold.SSEResumable)
			w.WriteHeader(http.StatusOK)
		}},
		{"to the entry box", true, func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }},
	} {
		c := newClient()
		cw := NewClientWriter(c, tc.keepMark)
		cw.Header().Set("Content-Type", "text/event-stream")
		cw.Header().Set(connhold.SSEHeader, connhold.SSEResumable)
		if cw.Written() {
			t.Fatalf("%s: written before anything was", tc.name)
		}
		tc.answer(cw)
		got := c.Result().Header.Get(connhold.SSEHeader)
		if want := map[bool]string{true: connhold.SSEResumable}[tc.keepMark]; got != want {
			t.Errorf("%s: the answer went out with Lchat-Sse %q, want %q", tc.name, got, want)
		}
		if !cw.Written() {
			t.Errorf("%s: not written after the answer began", tc.name)
		}
	}
	// A 101 counts as written: the tunnel follows it.
	cw := NewClientWriter(newClient(), false)
	cw.WriteHeader(http.StatusSwitchingProtocols)
	if !cw.Written() {
		t.Error("a 101 is not written")
	}
}

// TestSSEWriterCut: the proxy's abort in a pass ends only the pass once the client's
// response is a resumable stream under way, whatever reached the writer of that pass (a
// reopen whose answer an output gate held when its instance ended has sent it nothing);
// before that, or for an answer passed through, the abort is the client's.
func TestSSEWriterCut(t *testing.T) {
	resumableFirst := func() *SSEWriter {
		sw := NewSSEWriter(newClient(), func() {})
		for k, vs := range sseHeader(true, "first") {
			sw.Header()[k] = vs
		}
		sw.WriteHeader(http.StatusOK)
		sw.Write([]byte("id: 1\ndata: a\n\n"))
		return sw
	}
	for _, tc := range []struct {
		name string
		sw   func() *SSEWriter
		v    any
		want bool
	}{
		{name: "first answer, nothing yet", sw: func() *SSEWriter { return NewSSEWriter(newClient(), func() {}) }, v: http.ErrAbortHandler},
		{name: "first answer passed through", v: http.ErrAbortHandler, sw: func() *SSEWriter {
			sw := NewSSEWriter(newClient(), func() {})
			sw.WriteHeader(http.StatusOK)
			return sw
		}},
		{name: "first answer resumable", sw: resumableFirst, v: http.ErrAbortHandler, want: true},
		{name: "another panic", sw: resumableFirst, v: "boom"},
		{name: "reopen, its answer held by a gate", v: http.ErrAbortHandler, want: true, sw: func() *SSEWriter {
			sw := resumableFirst()
			sw.Reopen(func() {})
			return sw
		}},
		{name: "reopen answered resumable", v: http.ErrAbortHandler, want: true, sw: func() *SSEWriter {
			sw := resumableFirst()
			sw.Reopen(func() {})
			for k, vs := range sseHeader(true, "second") {
				sw.Header()[k] = vs
			}
			sw.WriteHeader(http.StatusOK)
			return sw
		}},
		{name: "reopen answered 503 by a gate", v: http.ErrAbortHandler, want: true, sw: func() *SSEWriter {
			sw := resumableFirst()
			sw.Reopen(func() {})
			sw.WriteHeader(http.StatusServiceUnavailable)
			return sw
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.sw().Cut(tc.v); got != tc.want {
				t.Errorf("Cut = %v, want %v", got, tc.want)
			}
		})
	}
}
