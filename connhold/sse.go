package connhold

import (
	"bytes"
	"errors"
	"mime"
	"net/http"
	"strings"
)

// Server-sent events the box keeps open across a space's sleep (docs/connections.md).
const (
	// SSEHeader, with the value SSEResumable on a text/event-stream answer, marks the
	// stream resumable: the stream does not keep the space awake, and when the instance
	// goes (the space sleeps) the box keeps the client's response open with comment
	// keepalives and reopens the stream at the next wake with Last-Event-ID.
	SSEHeader    = "Lchat-Sse"
	SSEResumable = "resumable"
)

// Resumable reports whether an answer is a stream the box may resume.
func Resumable(status int, h http.Header) bool {
	ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return status == http.StatusOK && ct == "text/event-stream" &&
		strings.EqualFold(strings.TrimSpace(h.Get(SSEHeader)), SSEResumable)
}

// AcceptsEventStream reports whether r asks for server-sent events (EventSource sends
// Accept: text/event-stream).
func AcceptsEventStream(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// MaxSSEEvent bounds one event the box buffers while it waits for the event's end.
const MaxSSEEvent = 1 << 20

// ErrSSEEventTooLarge: an event longer than MaxSSEEvent without its blank line.
var ErrSSEEventTooLarge = errors.New("server-sent event over 1 MiB")

// SSEEvents passes a stream on event by event, so that a stream cut in the middle of an
// event (its instance stopped) and resumed from another instance never hands the client
// half an event, and remembers the last event id the client has seen.
type SSEEvents struct {
	partial []byte
	lastID  string
	hasID   bool
}

// Feed takes bytes of the stream and returns the complete events among them (and before
// them), ready to write; an incomplete event is kept for the next Feed.
func (s *SSEEvents) Feed(b []byte) ([]byte, error) {
	s.partial = append(s.partial, b...)
	end := 0
	for i := 0; i < len(s.partial); {
		j := bytes.IndexByte(s.partial[i:], '\n')
		if j < 0 {
			break
		}
		line := bytes.TrimSuffix(s.partial[i:i+j], []byte{'\r'})
		i += j + 1
		if len(line) == 0 {
			// An event ends: its lines are s.partial[end:i].
			s.noteID(s.partial[end:i])
			end = i
		}
	}
	if end == 0 {
		if len(s.partial) > MaxSSEEvent {
			return nil, ErrSSEEventTooLarge
		}
		return nil, nil
	}
	out := bytes.Clone(s.partial[:end])
	s.partial = append(s.partial[:0], s.partial[end:]...)
	return out, nil
}

// noteID reads the id fields of complete events (WHATWG HTML: an id field sets the last
// event id, unless it contains NULL).
func (s *SSEEvents) noteID(events []byte) {
	for line := range bytes.SplitSeq(events, []byte{'\n'}) {
		line = bytes.TrimSuffix(line, []byte{'\r'})
		v, ok := bytes.CutPrefix(line, []byte("id"))
		if !ok {
			continue
		}
		switch {
		case len(v) == 0:
		case v[0] == ':':
			v = bytes.TrimPrefix(v[1:], []byte{' '})
		default:
			continue // a field named id-something
		}
		if bytes.IndexByte(v, 0) >= 0 {
			continue
		}
		s.lastID, s.hasID = string(v), true
	}
}

// Cut drops an incomplete event: the stream it came from has ended.
func (s *SSEEvents) Cut() { s.partial = s.partial[:0] }

// LastID is the last event id passed on, and whether there was one.
func (s *SSEEvents) LastID() (string, bool) { return s.lastID, s.hasID }
