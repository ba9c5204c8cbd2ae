package gate

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// client is the client's side of a Writer: it records what would go on the wire, in
// order ("header 201", "body done", "flush"), and the header each status went out with.
type client struct {
	mu      sync.Mutex
	h       http.Header
	events  []string
	headers []http.Header // a copy per status, in order
}

func newClient() *client { return &client{h: http.Header{}} }

func (c *client) Header() http.Header { return c.h }

func (c *client) WriteHeader(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, "header "+http.StatusText(code))
	c.headers = append(c.headers, c.h.Clone())
}

func (c *client) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, "body "+string(b))
	return len(b), nil
}

func (c *client) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, "flush")
}

func (c *client) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// proxy makes a reverse proxy's calls on a Writer one after another, on its own
// goroutine, as Caddy's does, and keeps the error of the last Write.
type proxy struct {
	calls chan func() error
	mu    sync.Mutex
	err   error
}

func newProxy(ctx context.Context) *proxy {
	p := &proxy{calls: make(chan func() error)}
	go func() {
		for {
			select {
			case call := <-p.calls:
				err := call()
				p.mu.Lock()
				p.err = err
				p.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	return p
}

func (p *proxy) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// writerOp is one step of a Writer scenario: a proxy call ("header 201", "write done",
// "flush", "set Name: value" on the instance's header) or the glue's "finish", an answer to the Ship in flight,
// or time passing; then what the client has seen, the Ships started, and whether the
// last call's error matches ErrNotDurable.
type writerOp struct {
	call   string
	answer bool
	result error
	sleep  time.Duration

	seen      []string
	ships     int
	callFails bool
}

const retryAfter = 7

var answer503 = []string{"header Service Unavailable", "body " + refusal}

// TestWriter: a table of answers written through a Writer while the test scripts the
// Ships: the final status and each body chunk reach the client only after a Ship that
// started after them, the status and its first chunk (or a Flush, or Finish) after one
// Ship together, a 101 at its WriteHeader; a failed wait turns the answer into a 503 with Retry-After and
// drops the rest; a chunk whose wait fails cuts the answer short; a 1xx passes at once.
func TestWriter(t *testing.T) {
	fenced := errors.Join(ErrFenced, errors.New("log sealed by box-b"))
	for _, tc := range []struct {
		name    string
		ops     []writerOp
		header  http.Header // the header the last status went out with, if set
		noneOf  []string    // header fields that must not reach the client
		refused bool        // Err matches ErrNotDurable
	}{
		{name: "a 201 and its body pass together after one ship", ops: []writerOp{
			{call: "set Location: /notes/9"},
			{call: "header 201"},
			{call: "set X-Note: 9"}, // before the pass: it goes out with the status
			{call: "write done", ships: 1},
			{answer: true, seen: []string{"header Created", "body done"}, ships: 1},
		}, header: http.Header{"Location": {"/notes/9"}, "X-Note": {"9"}}},
		{name: "a 201 with no body passes only at finish after one ship", ops: []writerOp{
			{call: "set Location: /notes/9"},
			{call: "header 201"},
			{call: "finish", ships: 1},
			{answer: true, seen: []string{"header Created"}, ships: 1},
		}, header: http.Header{"Location": {"/notes/9"}}},
		{name: "finish with nothing recorded writes nothing", ops: []writerOp{
			{call: "finish"},
			{call: "finish"},
		}},
		{name: "finish twice ships once", ops: []writerOp{
			{call: "header 204"},
			{call: "finish", ships: 1},
			{answer: true, seen: []string{"header No Content"}, ships: 1},
			{call: "finish", seen: []string{"header No Content"}, ships: 1},
		}},
		{name: "finish after the body passed does nothing", ops: []writerOp{
			{call: "header 200"},
			{call: "write a", ships: 1},
			{answer: true, seen: []string{"header OK", "body a"}, ships: 1},
			{call: "finish", seen: []string{"header OK", "body a"}, ships: 1},
		}},
		{name: "an error answer waits as well", ops: []writerOp{
			{call: "header 500"},
			{call: "write oops", ships: 1},
			{answer: true, seen: []string{"header Internal Server Error", "body oops"}, ships: 1},
		}},
		{name: "a 101 still waits at its status", ops: []writerOp{
			{call: "header 101", ships: 1},
			{answer: true, seen: []string{"header Switching Protocols"}, ships: 1},
			{call: "finish", seen: []string{"header Switching Protocols"}, ships: 1},
		}},
		{name: "a fenced wait turns the answer into a 503 and drops the body", ops: []writerOp{
			{call: "set Set-Cookie: session=new"},
			{call: "header 201"},
			{call: "write {\"id\":9}", ships: 1},
			{answer: true, result: fenced, seen: answer503, ships: 1},
			{call: "set Trailer-Sum: 9", seen: answer503, ships: 1},
			{call: "flush", seen: append(answer503, "flush"), ships: 1},
			{call: "header 200", seen: append(answer503, "flush"), ships: 1},
			{call: "finish", seen: append(answer503, "flush"), ships: 1},
		}, header: http.Header{
			"Via": {"1.1 box-a"}, "Retry-After": {"7"}, "Content-Type": {"text/plain; charset=utf-8"},
			"Content-Length": {strconv.Itoa(len(refusal))}, "Cache-Control": {"no-store"}, "X-Content-Type-Options": {"nosniff"},
		}, noneOf: []string{"Set-Cookie", "Trailer-Sum"}, refused: true},
		{name: "a refused recorded status at finish gives the 503", ops: []writerOp{
			{call: "set Set-Cookie: session=new"},
			{call: "header 201"},
			{call: "finish", ships: 1},
			{answer: true, result: fenced, seen: answer503, ships: 1},
			{call: "finish", seen: answer503, ships: 1},
		}, header: http.Header{
			"Via": {"1.1 box-a"}, "Retry-After": {"7"}, "Content-Length": {strconv.Itoa(len(refusal))}, "Cache-Control": {"no-store"},
		}, noneOf: []string{"Set-Cookie"}, refused: true},
		{name: "a wait past the timeout answers 503", ops: []writerOp{
			{call: "header 200"},
			{call: "write late", ships: 1},
			{sleep: 10*time.Second - time.Millisecond, ships: 1},
			{sleep: time.Millisecond, seen: answer503, ships: 1},
			{call: "write later", seen: answer503, ships: 1},
		}, refused: true},
		{name: "a streamed body waits per chunk", ops: []writerOp{
			{call: "header 200"},
			{call: "write a", ships: 1},
			{answer: true, seen: []string{"header OK", "body a"}, ships: 1},
			{call: "flush", seen: []string{"header OK", "body a", "flush"}, ships: 1},
			{call: "write b", seen: []string{"header OK", "body a", "flush"}, ships: 2},
			{answer: true, seen: []string{"header OK", "body a", "flush", "body b"}, ships: 2},
		}},
		{name: "a chunk whose wait fails cuts the answer short", ops: []writerOp{
			{call: "header 200"},
			{call: "write a", ships: 1},
			{answer: true, seen: []string{"header OK", "body a"}, ships: 1},
			{call: "write b", ships: 2, seen: []string{"header OK", "body a"}},
			{answer: true, result: fenced, seen: []string{"header OK", "body a"}, ships: 2, callFails: true},
			{call: "write c", seen: []string{"header OK", "body a"}, ships: 2, callFails: true},
			{call: "finish", seen: []string{"header OK", "body a"}, ships: 2},
		}, refused: true},
		{name: "a 1xx passes at once, the final status waits", ops: []writerOp{
			{call: "header 103", seen: []string{"header Early Hints"}},
			{call: "header 200", seen: []string{"header Early Hints"}},
			{call: "write x", seen: []string{"header Early Hints"}, ships: 1},
			{answer: true, seen: []string{"header Early Hints", "header OK", "body x"}, ships: 1},
		}},
		{name: "a status after the recorded one is dropped", ops: []writerOp{
			{call: "header 201"},
			{call: "header 500"},
			{call: "write x", ships: 1},
			{answer: true, seen: []string{"header Created", "body x"}, ships: 1},
		}},
		{name: "a body without a status waits once for both", ops: []writerOp{
			{call: "write x", ships: 1},
			{answer: true, seen: []string{"header OK", "body x"}, ships: 1},
		}},
		{name: "a flush before the status sends a 200 after the wait", ops: []writerOp{
			{call: "flush", ships: 1},
			{answer: true, seen: []string{"header OK", "flush"}, ships: 1},
		}},
		{name: "a status then a flush waits once", ops: []writerOp{
			{call: "header 202"},
			{call: "flush", ships: 1},
			{answer: true, seen: []string{"header Accepted", "flush"}, ships: 1},
			{call: "flush", seen: []string{"header Accepted", "flush", "flush"}, ships: 1},
			{call: "write a", seen: []string{"header Accepted", "flush", "flush"}, ships: 2},
			{answer: true, seen: []string{"header Accepted", "flush", "flush", "body a"}, ships: 2},
		}},
		{name: "a flush before the body of an answer of known length does nothing: status and body wait once", ops: []writerOp{
			{call: "set Content-Length: 4"},
			{call: "header 201"},
			{call: "flush"}, // Caddy's proxy, at the start of every answer
			{call: "write done", ships: 1},
			{answer: true, seen: []string{"header Created", "body done"}, ships: 1},
			{call: "flush", seen: []string{"header Created", "body done", "flush"}, ships: 1},
			{call: "finish", seen: []string{"header Created", "body done", "flush"}, ships: 1},
		}},
		{name: "a bodiless answer of known length flushed early passes at finish", ops: []writerOp{
			{call: "set Content-Length: 0"},
			{call: "header 204"},
			{call: "flush"},
			{call: "finish", ships: 1},
			{answer: true, seen: []string{"header No Content"}, ships: 1},
		}},
		{name: "an answer of known length flushed before any status sends a 200 at finish", ops: []writerOp{
			{call: "set Content-Length: 0"},
			{call: "flush"},
			{call: "finish", ships: 1},
			{answer: true, seen: []string{"header OK"}, ships: 1},
		}},
		{name: "an empty first write waits for the status", ops: []writerOp{
			{call: "header 200"},
			{call: "write ", ships: 1},
			{answer: true, seen: []string{"header OK", "body "}, ships: 1},
		}},
		{name: "a later empty write does not wait", ops: []writerOp{
			{call: "header 200"},
			{call: "write a", ships: 1},
			{answer: true, seen: []string{"header OK", "body a"}, ships: 1},
			{call: "write ", seen: []string{"header OK", "body a", "body "}, ships: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				log := newFakeLog()
				g := New(log.config(1))
				defer g.Close(nil)
				c := newClient()
				c.h.Set("Via", "1.1 box-a") // the box's own, before the proxy's
				w := NewWriter(ctx, c, g, WriterConfig{RetryAfter: retryAfter, Timeout: 10 * time.Second})
				p := newProxy(ctx)
				for i, op := range tc.ops {
					if op.call != "" {
						p.calls <- callOn(t, w, op.call)
					}
					if op.answer {
						log.answer(op.result)
					}
					if op.sleep > 0 {
						time.Sleep(op.sleep)
					}
					synctest.Wait()
					if _, ships, _ := log.counts(); !slices.Equal(c.seen(), op.seen) || ships != op.ships {
						t.Fatalf("step %d (%q): client saw %q after %d ships, want %q after %d", i, op.call, c.seen(), ships, op.seen, op.ships)
					}
					if err := p.lastErr(); op.call != "" && (err != nil) != op.callFails || err != nil && !errors.Is(err, ErrNotDurable) {
						t.Fatalf("step %d (%q): call error %v", i, op.call, err)
					}
				}
				if tc.header != nil {
					got := c.headers[len(c.headers)-1]
					for k := range tc.header {
						if got.Get(k) != tc.header.Get(k) {
							t.Errorf("%s: %q, want %q (header %v)", k, got.Get(k), tc.header.Get(k), got)
						}
					}
				}
				for _, k := range tc.noneOf {
					for _, h := range append(c.headers, c.h) {
						if h.Get(k) != "" {
							t.Errorf("the client got %s: %q", k, h.Get(k))
						}
					}
				}
				if err := w.Err(); (err != nil) != tc.refused || err != nil && !errors.Is(err, ErrNotDurable) {
					t.Errorf("Err = %v", err)
				}
			})
		})
	}
}

// callOn is the proxy call a writerOp names.
func callOn(t *testing.T, w *Writer, call string) func() error {
	verb, arg, _ := strings.Cut(call, " ")
	switch verb {
	case "header":
		code := 0
		for _, ch := range arg {
			code = code*10 + int(ch-'0')
		}
		return func() error { w.WriteHeader(code); return nil }
	case "write":
		return func() error { _, err := w.Write([]byte(arg)); return err }
	case "flush":
		return func() error { return http.NewResponseController(w).Flush() }
	case "finish":
		return func() error { w.Finish(); return nil }
	case "set":
		k, v, _ := strings.Cut(arg, ": ")
		return func() error { w.Header().Set(k, v); return nil }
	}
	t.Fatalf("unknown call %q", call)
	return nil
}

// TestWriterRefuseHook: with WriterConfig.Refuse, a refused answer is what the hook
// writes, on a header of the box's own fields and Retry-After only.
func TestWriterRefuseHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		g := New(log.config(1))
		defer g.Close(nil)
		c := newClient()
		c.h.Set("Via", "1.1 box-a")
		var seen http.Header
		w := NewWriter(context.Background(), c, g, WriterConfig{RetryAfter: retryAfter, Refuse: func(rw http.ResponseWriter) {
			seen = rw.Header().Clone()
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusServiceUnavailable)
			rw.Write([]byte(`{"code":"unavailable"}`))
		}})
		w.Header().Set("Set-Cookie", "session=new")
		w.WriteHeader(http.StatusCreated)
		done := make(chan struct{})
		go func() { w.Write([]byte("created")); close(done) }()
		synctest.Wait()
		log.answer(errors.Join(ErrFenced, errors.New("sealed")))
		<-done
		want := []string{"header Service Unavailable", `body {"code":"unavailable"}`}
		if got := c.seen(); !slices.Equal(got, want) {
			t.Fatalf("client saw %q, want %q", got, want)
		}
		if seen.Get("Via") != "1.1 box-a" || seen.Get("Retry-After") != strconv.Itoa(retryAfter) || seen.Get("Set-Cookie") != "" {
			t.Fatalf("the hook got header %v", seen)
		}
	})
}

// TestWriterPassedHook: WriterConfig.Passed sees the final status once its wait succeeded,
// and what it sets goes out with it; a refused answer never calls it.
func TestWriterPassedHook(t *testing.T) {
	for _, fail := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			log := newFakeLog()
			g := New(log.config(1))
			defer g.Close(nil)
			c := newClient()
			var got []int
			w := NewWriter(context.Background(), c, g, WriterConfig{Passed: func(code int, h http.Header) {
				got = append(got, code)
				h.Set("X-Durable", "1")
			}})
			w.WriteHeader(http.StatusAccepted)
			done := make(chan struct{})
			go func() { w.Finish(); close(done) }()
			synctest.Wait()
			if fail {
				log.answer(errors.Join(ErrFenced, errors.New("sealed")))
			} else {
				log.answer(nil)
			}
			<-done
			if fail {
				if len(got) != 0 || c.headers[0].Get("X-Durable") != "" {
					t.Fatalf("refused: hook called %v, header %v", got, c.headers[0])
				}
				return
			}
			if !slices.Equal(got, []int{http.StatusAccepted}) || c.headers[0].Get("X-Durable") != "1" {
				t.Fatalf("passed: hook called %v, header %v", got, c.headers[0])
			}
		})
	}
}

// TestWriterStates pins the Writer's table of moves.
func TestWriterStates(t *testing.T) {
	for _, tc := range []struct {
		from             writerState
		record, ok, fail writerState
	}{
		{open, held, passing, refused},
		{held, held, passing, refused},
		{passing, passing, passing, broken},
		{refused, refused, refused, refused},
		{broken, broken, broken, broken},
	} {
		for _, m := range []struct {
			move move
			want writerState
		}{{record, tc.record}, {waited, tc.ok}, {failed, tc.fail}} {
			if got := tc.from.after(m.move); got != m.want {
				t.Errorf("%d after move %d: %d, want %d", tc.from, m.move, got, m.want)
			}
		}
	}
}

// TestWriterUnwrap: http.ResponseController reaches the client's writer through Unwrap.
func TestWriterUnwrap(t *testing.T) {
	c := newClient()
	w := NewWriter(context.Background(), c, New(Config{Cut: func(context.Context) (Land, error) { return nil, nil }}), WriterConfig{})
	if w.Unwrap() != http.ResponseWriter(c) {
		t.Fatal("Unwrap is not the client's writer")
	}
}
