package gate

import (
	"cmp"
	"context"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// refusal is the body of the 503 that replaces an answer whose wait failed.
const refusal = "503 the space's last writes are not yet durable; retry\n"

// DefaultRetryAfter is the Retry-After, in seconds, of a refused answer.
const DefaultRetryAfter = 1

// WriterConfig configures a Writer.
type WriterConfig struct {
	// RetryAfter is the Retry-After, in seconds, of the 503 that replaces an answer whose
	// wait failed. Default DefaultRetryAfter (1).
	RetryAfter int
	// Timeout bounds each wait (the status's, each chunk's) on top of the Writer's ctx:
	// the engine's durability deadline, e.g. 10s. Default none: only ctx ends a wait.
	Timeout time.Duration
	// Refuse, when set, writes the 503 that replaces an answer whose wait failed, in
	// place of the Writer's plain-text one (the glue's page, by the client's Accept). It
	// gets the client's writer with a header of the box's own fields and Retry-After
	// only, and must write the status 503; it may set fields and write a body.
	Refuse func(w http.ResponseWriter)
	// Passed, when set, is called once the instance's final status has waited and is about
	// to pass, with that status and the client's header: what is known only once the
	// commits before the answer are durable goes into the header there.
	Passed func(code int, h http.Header)
}

// writerState is where a Writer's answer stands.
type writerState uint8

const (
	// open: no final status yet. A 1xx passes at once.
	open writerState = iota
	// held: the instance's final status is recorded, not passed. It passes with the first
	// body chunk, at a Flush or at Finish, after one wait.
	held
	// passing: the instance's status passed (its wait succeeded); each body chunk passes
	// after its own wait.
	passing
	// refused: the status's wait failed. The client has a 503 in its place; whatever the
	// instance writes next is dropped.
	refused
	// broken: a chunk's wait failed after the status passed. The answer is cut short:
	// that chunk and every later one fail.
	broken
)

// move is what happens to a Writer's answer.
type move uint8

const (
	// record: a final status reached the Writer.
	record move = iota
	// waited: a wait succeeded.
	waited
	// failed: a wait failed.
	failed
)

// after is the state that follows move m in state s: the one table of a Writer's moves.
// A status recorded after the first is dropped; refused and broken are final.
func (s writerState) after(m move) writerState {
	switch s {
	case open:
		switch m {
		case record:
			return held
		case waited:
			return passing
		}
		return refused
	case held:
		switch m {
		case waited:
			return passing
		case failed:
			return refused
		}
	case passing:
		if m == failed {
			return broken
		}
	}
	return s
}

// Writer is the http.ResponseWriter a reverse proxy writes an instance's answer through
// when the space's durability is "bucket": each part of the answer reaches the client
// only after a Gate wait that began after that part reached the box, so every commit the
// instance made before it is durable. A status and its first chunk share one wait. What
// a client may observe:
//
//   - A 1xx informational status (100, 103; not 101) passes at once, without a wait: it
//     carries no answer.
//   - The final status (any 2xx to 5xx, an error answer alike) is recorded, not passed.
//     It passes with the header and the first body chunk, after one wait that began at
//     that chunk's Write (empty or not) or at a Flush. A Write or a Flush before any
//     status sends a 200 the same way. On an answer of known length (Content-Length set)
//     a Flush before the first chunk does nothing, so status and body share one wait
//     (FlushError says why). An answer without a body chunk (a 204, a HEAD, an
//     empty body) passes at Finish, after its wait; with no Finish it never passes. The
//     instance's header changes until the status passes go out with it, as they would
//     have before its WriteHeader.
//   - A 101 waits at WriteHeader and passes at once, before its tunnel is hijacked.
//   - Each later non-empty body Write waits again before it passes (a streamed chunk may
//     reveal a later commit). Flush passes on at once: all it can flush passed a wait.
//   - If the status's wait fails (ctx ended, WriterConfig.Timeout, a fenced or closed
//     gate), the client never sees the instance's status, header or body. It gets a
//     complete 503 Service Unavailable with Retry-After (WriterConfig.RetryAfter), the
//     box's own header as it stood at NewWriter (the instance's removed: no Set-Cookie, no
//     Location), Cache-Control: no-store and a short text/plain body. The instance's
//     Writes succeed and are dropped, so the proxy finishes cleanly and the 503 arrives
//     whole (the proxy drains the instance's body meanwhile); its later header changes
//     (trailers) go to a discarded header.
//   - If a chunk's wait fails after the status passed, that chunk and every later one
//     are not passed and their Writes fail (an error matching ErrNotDurable), which makes
//     Caddy's reverse proxy abort the response: the client sees the status and the chunks
//     that passed, then a truncated body (HTTP/1.1: the connection closes before the
//     declared length or the last chunk; HTTP/2 and 3: the stream is reset). It never
//     sees a complete answer.
//
// A hijacked connection (a 101's tunnel, through Unwrap) is not gated past its status.
// The proxy's calls and Finish are serialized (Caddy flushes from a timer goroutine).
type Writer struct {
	w          http.ResponseWriter
	ctx        context.Context
	g          *Gate
	retryAfter int
	refuse     func(http.ResponseWriter)
	passed     func(int, http.Header)
	timeout    time.Duration
	own        http.Header // the box's own header at NewWriter, kept on a 503

	mu sync.Mutex
	// Written by the proxy's calls and Finish, under mu.
	state   writerState
	code    int         // the recorded final status; 0 before one
	err     error       // the wait's error that refused or broke the answer
	dropped http.Header // Header() once refused: the instance's late header changes
	// flushHeld: a Flush came before the status passed on an answer of known length and
	// did nothing (FlushError says why); Finish passes a 200 for it if nothing else did.
	flushHeld bool
}

// NewWriter is a Writer in front of w whose waits are on g and end with ctx (the
// request's: a client that leaves ends them).
func NewWriter(ctx context.Context, w http.ResponseWriter, g *Gate, cfg WriterConfig) *Writer {
	ra := cfg.RetryAfter
	if ra <= 0 {
		ra = DefaultRetryAfter
	}
	return &Writer{w: w, ctx: ctx, g: g, retryAfter: ra, timeout: cfg.Timeout, refuse: cfg.Refuse, passed: cfg.Passed, own: w.Header().Clone()}
}

// Err is the wait's error that refused the answer (a 503 in its place) or broke it (cut
// short), nil while neither happened. It matches ErrNotDurable.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Header is the header the instance's answer goes out with, the client's: a change made
// before the status passes (recorded or not) goes out with it. Once the answer is
// refused, a discarded one.
func (w *Writer) Header() http.Header {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == refused {
		return w.dropped
	}
	return w.w.Header()
}

// WriteHeader passes a 1xx informational status on at once and records the final status:
// it passes with the first body chunk, at a Flush or at Finish, after their one wait. A
// 101 passes after its own wait. In place of a status whose wait fails the client gets a
// 503. A status after the final one is dropped.
func (w *Writer) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != open {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		w.w.WriteHeader(code)
		return
	}
	w.code = code
	w.state = w.state.after(record)
	if code == http.StatusSwitchingProtocols {
		w.passLocked() // the proxy hijacks the connection next: nothing else would pass it
	}
}

// Write passes a body chunk on after a wait; the first chunk shares its wait with the
// status (a 200 if none was recorded). Once the answer is refused it drops b and reports
// success; once it is broken it fails with the wait's error.
func (w *Writer) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case open, held:
		w.passLocked() // its wait began after b was in: it covers b
	case passing:
		if len(b) > 0 {
			w.moveLocked(w.waitLocked())
		}
	}
	switch w.state {
	case passing:
		return w.w.Write(b)
	case refused:
		return len(b), nil
	default:
		return 0, w.err
	}
}

// FlushError flushes what passed to the client (a 503 in place of a refused answer), for
// http.ResponseController. Before the status passed it passes it first (a 200 if none
// was recorded), after its wait; except on an answer of known length (a Content-Length
// in its header), whose header alone is not worth a wait of its own: such a flush does
// nothing, and the status passes with the first body chunk (or at Finish), flushed by
// the proxy's next flush or the server's at the handler's end. Caddy's proxy flushes once
// at the start of every answer when its flush interval is negative (the glue's default,
// so streams are not held back), and the first chunk, read from the instance after that
// wait began, would then wait for a second shipment.
func (w *Writer) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == open || w.state == held {
		if w.w.Header().Get("Content-Length") != "" {
			w.flushHeld = true
			return nil
		}
		w.passLocked()
	}
	return http.NewResponseController(w.w).Flush()
}

// Flush is FlushError for an http.Flusher.
func (w *Writer) Flush() { _ = w.FlushError() }

// Finish tells the Writer the proxy returned. A recorded status that has not passed (the
// answer had no body chunk and no Flush) passes after a wait, or a 503 in its place. With
// no status recorded (the proxy wrote nothing: its own error answer goes through another
// writer) Finish does nothing. Finish is idempotent; the caller must call it once the
// proxy returns, or a bodiless answer never reaches the client.
func (w *Writer) Finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == held || w.state == open && w.flushHeld {
		w.passLocked()
	}
}

// Unwrap is the client's writer, for http.ResponseController (deadlines, a hijack).
func (w *Writer) Unwrap() http.ResponseWriter { return w.w }

func (w *Writer) waitLocked() error { return w.g.WaitFor(w.ctx, w.timeout) }

// passLocked passes the recorded status (a 200 if none) after a wait, or a 503 in its
// place, in state open or held.
func (w *Writer) passLocked() {
	w.moveLocked(w.waitLocked())
	switch w.state {
	case passing:
		code := cmp.Or(w.code, http.StatusOK)
		if w.passed != nil {
			w.passed(code, w.w.Header())
		}
		w.w.WriteHeader(code)
	case refused:
		w.refuseLocked()
	}
}

func (w *Writer) moveLocked(err error) {
	if err != nil {
		w.state = w.state.after(failed)
		w.err = err
		return
	}
	w.state = w.state.after(waited)
}

// refuseLocked answers 503 in place of the instance's answer.
func (w *Writer) refuseLocked() {
	w.dropped = http.Header{}
	h := w.w.Header()
	clear(h)
	maps.Copy(h, w.own)
	if w.refuse != nil {
		h.Set("Retry-After", strconv.Itoa(w.retryAfter))
		w.refuse(w.w)
		return
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set("Retry-After", strconv.Itoa(w.retryAfter))
	h.Set("Content-Length", strconv.Itoa(len(refusal)))
	w.w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.w.Write([]byte(refusal)) // a client gone or a HEAD: nothing else to tell it
}

// Interface guards
var (
	_ http.ResponseWriter = (*Writer)(nil)
	_ http.Flusher        = (*Writer)(nil)
)
