package held

import (
	"bytes"
	"errors"
	"net/http"

	"github.com/lchat/lchat-caddy/connhold"
)

// The writers a reverse proxy writes an instance's answer through, for the requests
// that may become held connections: the glue passes one in place of the client's writer.

// ClientWriter is the writer of every answer the box sends, whatever door it came through
// (an instance's, a peer's, a live upstream's, the box's own, a 101's before its tunnel):
// it takes the Lchat-Sse mark (connhold.SSEHeader), an instance's word to the box, off each
// header as it goes out, so that no client sees it, whether or not the request asked for
// an event stream. The writers above it (SSEWriter, gate.Writer) read the mark before it
// goes. KeepMark keeps it on an answer to the entry box that holds the stream.
type ClientWriter struct {
	http.ResponseWriter
	keepMark bool
	wrote    bool // a final status (or a 101) went out
}

// NewClientWriter is a ClientWriter in front of w; keepMark keeps the Lchat-Sse mark (the
// answer goes to the entry box holding the client's stream, never to a client).
func NewClientWriter(w http.ResponseWriter, keepMark bool) *ClientWriter {
	return &ClientWriter{ResponseWriter: w, keepMark: keepMark}
}

// Written reports whether the answer's status went out: nothing else may be written
// in its place.
func (w *ClientWriter) Written() bool { return w.wrote }

func (w *ClientWriter) strip() {
	if !w.keepMark {
		w.ResponseWriter.Header().Del(connhold.SSEHeader)
	}
}

func (w *ClientWriter) WriteHeader(code int) {
	w.strip()
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *ClientWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.strip()
		w.wrote = true
	}
	return w.ResponseWriter.Write(b)
}

// FlushError flushes, for http.ResponseController; a flush before the status sends the
// header, so it is stripped first.
func (w *ClientWriter) FlushError() error {
	if !w.wrote {
		w.strip()
		w.wrote = true
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for an http.Flusher.
func (w *ClientWriter) Flush() { _ = w.FlushError() }

// Unwrap lets the proxy reach the client's writer (a hijack, full duplex, deadlines).
func (w *ClientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// HoldWriter stands between a reverse proxy and the client for a WebSocket upgrade
// request: an instance answer that opts in (connhold.Opted) is kept, not written, so the
// box can complete the handshake itself (Conns.Accept); any other answer (a 101 and its
// tunnel included) passes through.
type HoldWriter struct {
	http.ResponseWriter
	wrote  bool
	held   bool
	status int
	header http.Header
	body   bytes.Buffer
}

// NewHoldWriter is a HoldWriter in front of w.
func NewHoldWriter(w http.ResponseWriter) *HoldWriter { return &HoldWriter{ResponseWriter: w} }

// Held reports whether the instance opted in: its answer was kept.
func (w *HoldWriter) Held() bool { return w.held }

// Answer is the kept answer: its status, header and body (up to connhold.MaxAnswer).
func (w *HoldWriter) Answer() (status int, header http.Header, body []byte) {
	return w.status, w.header, w.body.Bytes()
}

func (w *HoldWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code) // informational: passed on, not the answer
		return
	}
	w.wrote = true
	if connhold.Opted(code, w.ResponseWriter.Header()) {
		w.held, w.status, w.header = true, code, w.ResponseWriter.Header().Clone()
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *HoldWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.held {
		return w.ResponseWriter.Write(b)
	}
	if w.body.Len()+len(b) > connhold.MaxAnswer {
		return 0, errors.New("opt-in answer too large")
	}
	return w.body.Write(b)
}

// Flush passes on unless the answer is kept.
func (w *HoldWriter) Flush() {
	if !w.held {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap lets the proxy hijack the connection for a tunnel.
func (w *HoldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ackWriter stamps a 2xx answer's header before it is written (Conns.PeerEvent).
type ackWriter struct {
	http.ResponseWriter
	stamp func(http.Header)
	wrote bool
}

func (w *ackWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.wrote = true
		if code/100 == 2 {
			w.stamp(w.ResponseWriter.Header())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *ackWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *ackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// SSEWriter stands between a reverse proxy and the client for a request that asks for
// server-sent events. An answer that is not a resumable stream passes through untouched.
// A resumable one is passed on whole event by event (connhold.SSEEvents), its Use
// released at once (the stream does not keep the space awake), and the writer can be
// reopened on a later answer from the next instance (Reopen): that answer's header is
// read, not written, and its events go on in the same client response. The Lchat-Sse
// mark never reaches a client; it stays on an answer to the entry box that holds the
// stream (KeepMark).
type SSEWriter struct {
	w           http.ResponseWriter
	hdr         http.Header // where the proxy puts the current answer's header
	sent        bool        // the client's header is written
	gotHeader   bool        // the current answer's status is in
	passthrough bool        // the first answer was not resumable
	resumable   bool        // the current answer is a resumable stream
	status      int         // the current answer's status; 0 before it
	keepMark    bool        // the answer goes to the entry box holding the stream
	release     func()      // ends the current answer's Use
	ev          connhold.SSEEvents
}

// NewSSEWriter is an SSEWriter in front of w; release ends the answer's Use once it is a
// resumable stream.
func NewSSEWriter(w http.ResponseWriter, release func()) *SSEWriter {
	return &SSEWriter{w: w, hdr: w.Header(), release: release}
}

// KeepMark keeps the Lchat-Sse mark on the answer: it goes to the entry box that holds
// the stream, not to a client.
func (s *SSEWriter) KeepMark() { s.keepMark = true }

// Sent reports whether the client's header is written.
func (s *SSEWriter) Sent() bool { return s.sent }

// ToHold reports whether the stream is the box's to hold: its first answer was a
// resumable stream, and so is the current one.
func (s *SSEWriter) ToHold() bool { return s.resumable && !s.passthrough }

// Answer is how the current answer began: its status (0 before it) and whether it is a
// resumable stream.
func (s *SSEWriter) Answer() (status int, resumable bool) { return s.status, s.resumable }

// Cut reports whether v, a panic out of the proxy in a pass (http.ErrAbortHandler: the
// upstream ended an answer it had begun), ends only that pass, not the client's response:
// the response is a resumable stream under way, which a pass reaches only with whole events
// of a resumable answer. So it is too when the pass's answer never reached this writer (an
// output gate held its header when its instance ended) or was not a resumable stream: the
// client has had nothing of it, and the holder goes on by the pass's Answer.
func (s *SSEWriter) Cut(v any) bool {
	return v == http.ErrAbortHandler && s.sent && !s.passthrough
}

// LastID is the id of the last whole event passed on, if it had one.
func (s *SSEWriter) LastID() (string, bool) { return s.ev.LastID() }

// Reopen readies the writer for the next instance's answer, whose Use release ends.
func (s *SSEWriter) Reopen(release func()) {
	s.ev.Cut()
	s.hdr, s.gotHeader, s.resumable, s.status, s.release = http.Header{}, false, false, 0, release
}

// SetRelease makes release end the current answer's Use.
func (s *SSEWriter) SetRelease(release func()) { s.release = release }

// Comment writes raw stream text (a keepalive, a retry hint) between events.
func (s *SSEWriter) Comment(text string) error {
	if _, err := s.w.Write([]byte(text)); err != nil {
		return err
	}
	return http.NewResponseController(s.w).Flush()
}

func (s *SSEWriter) Header() http.Header { return s.hdr }

func (s *SSEWriter) WriteHeader(code int) {
	if code < 200 {
		if !s.sent {
			s.w.WriteHeader(code)
		}
		return
	}
	if s.gotHeader {
		return
	}
	s.gotHeader, s.status = true, code
	s.resumable = connhold.Resumable(code, s.hdr)
	if s.resumable {
		s.release()
	}
	if !s.sent {
		s.sent = true
		s.passthrough = !s.resumable
		if !s.keepMark {
			s.hdr.Del(connhold.SSEHeader)
		}
		s.w.WriteHeader(code)
	}
}

func (s *SSEWriter) Write(b []byte) (int, error) {
	if !s.gotHeader {
		s.WriteHeader(http.StatusOK)
	}
	if s.passthrough {
		return s.w.Write(b)
	}
	if !s.resumable {
		return len(b), nil // a reopen answered with something else: the stream ends
	}
	out, err := s.ev.Feed(b)
	if err != nil {
		return 0, err
	}
	if len(out) > 0 {
		if _, err := s.w.Write(out); err != nil {
			return 0, err
		}
		http.NewResponseController(s.w).Flush()
	}
	return len(b), nil
}

// Flush passes on once the client's header is written: for an answer passed through,
// and for a resumable one, whose events are written whole (so a flush never sends half
// of one) and which must reach the client at once even before its first event, or an
// EventSource stays connecting until the first keepalive.
func (s *SSEWriter) Flush() {
	if s.sent {
		http.NewResponseController(s.w).Flush()
	}
}

// Unwrap lets the proxy reach the client's writer (full duplex, deadlines).
func (s *SSEWriter) Unwrap() http.ResponseWriter { return s.w }

// Interface guards
var (
	_ http.Flusher = (*ClientWriter)(nil)
	_ http.Flusher = (*HoldWriter)(nil)
	_ http.Flusher = (*SSEWriter)(nil)
)
