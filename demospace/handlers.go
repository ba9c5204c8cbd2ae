package demospace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap"
)

// Limits on what clients may post.
const (
	MaxTextRunes   = 2000
	MaxAuthorRunes = 64
	MaxBodyBytes   = 64 << 10
	// defaultListLimit and maxListLimit bound GET /api/messages.
	defaultListLimit = 100
	maxListLimit     = 1000
)

// Handler returns the space's HTTP routes. Cross-origin browser writes are
// refused; requests without browser origin headers (the proxy's scheduled
// wake, curl) pass.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.handlePage)
	mux.HandleFunc("POST /{$}", s.handleRootPost)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("GET /api/messages", s.handleListMessages)
	mux.HandleFunc("POST /api/messages", s.handlePostMessage)
	mux.HandleFunc("GET /api/events", s.handleEvents)
	mux.HandleFunc("GET /api/ws", s.handleWS)
	if s.hold {
		mux.HandleFunc("POST /.lchat/ws/event", s.handleHeldEvent)
	}
	mux.HandleFunc("GET /api/reminders", s.handleListReminders)
	mux.HandleFunc("POST /api/reminders", s.handlePostReminder)
	mux.HandleFunc("POST /api/wake", s.handleWake)
	return http.NewCrossOriginProtection().Handler(mux)
}

// handleHealth answers ok without touching the database: New opened it (and pinged it)
// before the socket was served, so an answer already says it is open. The box probes it
// beside a wake's first request (ready_path), and a ping there would take the pool's one
// connection or, with the first request holding it, open a second (the SQLite open, its
// pragmas and the schema read: about 1.5 ms of CPU per wake, a quarter of the room's start).
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok")
}

func (s *Server) handleListMessages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after := int64(-1)
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid after %q: want a message id", v))
			return
		}
		after = n
	}
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid limit %q: want 1 to %d", v, maxListLimit))
			return
		}
		limit = n
	}
	msgs, err := s.store.messages(r.Context(), after, limit)
	if err != nil {
		s.logger.Error("listing messages", zap.Error(err))
		writeError(w, http.StatusInternalServerError, "reading messages failed")
		return
	}
	writeJSON(w, http.StatusOK, msgs)
}

// messageInput is the body of POST /api/messages.
type messageInput struct {
	Author string `json:"author"`
	Text   string `json:"text"`
}

func (s *Server) handlePostMessage(w http.ResponseWriter, r *http.Request) {
	// A plain HTML form (no JavaScript) posts url-encoded and wants the page back.
	form := isForm(r)
	var in messageInput
	if form {
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		if err := r.ParseForm(); err != nil {
			writeBodyError(w, err)
			return
		}
		in.Author, in.Text = r.PostForm.Get("author"), r.PostForm.Get("text")
	} else if !decodeJSON(w, r, &in) {
		return
	}
	author, text, err := validateMessage(in.Author, in.Text)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	m, err := s.postMessage(r, author, text)
	if err != nil {
		s.writeWriteError(w, err)
		return
	}
	if form {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	writeJSON(w, http.StatusCreated, m)
}

func (s *Server) postMessage(r *http.Request, author, text string) (Message, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return Message{}, errClosed
	}
	m, err := s.store.insertMessage(r.Context(), author, text, KindUser, s.clock.Now())
	if err != nil {
		return Message{}, err
	}
	s.hub.publish(m)
	if s.hold {
		s.sendHeldLocked(m)
	}
	return m, nil
}

// validateMessage trims and checks a posted message. An empty author posts as
// "anonymous".
func validateMessage(author, text string) (string, string, error) {
	author = strings.TrimSpace(author)
	text = strings.TrimSpace(text)
	if !utf8.ValidString(author) || !utf8.ValidString(text) {
		return "", "", errors.New("author and text must be valid UTF-8")
	}
	if text == "" {
		return "", "", errors.New("text is required")
	}
	if n := utf8.RuneCountInString(text); n > MaxTextRunes {
		return "", "", fmt.Errorf("text is %d characters; the limit is %d", n, MaxTextRunes)
	}
	if n := utf8.RuneCountInString(author); n > MaxAuthorRunes {
		return "", "", fmt.Errorf("author is %d characters; the limit is %d", n, MaxAuthorRunes)
	}
	if strings.ContainsFunc(author, unicode.IsControl) {
		return "", "", errors.New("author must not contain control characters")
	}
	if strings.ContainsFunc(text, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' }) {
		return "", "", errors.New("text must not contain control characters other than tab and newline")
	}
	if author == "" {
		author = "anonymous"
	}
	return author, text, nil
}

// reminderInput is the body of POST /api/reminders.
type reminderInput struct {
	At   string `json:"at"`
	Text string `json:"text"`
}

// Reminder times must be printable as RFC 3339 with a four-digit year.
var (
	minReminder = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxReminder = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

func (s *Server) handlePostReminder(w http.ResponseWriter, r *http.Request) {
	var in reminderInput
	if !decodeJSON(w, r, &in) {
		return
	}
	if in.At == "" {
		writeError(w, http.StatusBadRequest, `at is required (an RFC 3339 time such as "2030-01-02T15:04:05Z")`)
		return
	}
	at, err := time.Parse(time.RFC3339, in.At)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("at %q is not an RFC 3339 time such as \"2030-01-02T15:04:05Z\"", in.At))
		return
	}
	if at.Before(minReminder) || at.After(maxReminder) {
		writeError(w, http.StatusBadRequest, "at must be between 1970 and 9999")
		return
	}
	_, text, err := validateMessage("", in.Text)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Second precision: next-wake carries whole seconds, and the wake at that
	// second must find the reminder due.
	at = at.Truncate(time.Second)
	rem, err := func() (Reminder, error) {
		s.writeMu.Lock()
		defer s.writeMu.Unlock()
		if s.closed {
			return Reminder{}, errClosed
		}
		rem, err := s.store.insertReminder(r.Context(), at, text, s.clock.Now())
		if err != nil {
			return Reminder{}, err
		}
		return rem, s.rescheduleLocked(r.Context())
	}()
	if err != nil {
		s.writeWriteError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, rem)
}

// reminderList is the answer of GET /api/reminders.
type reminderList struct {
	Pending  []Reminder `json:"pending"`
	NextWake *time.Time `json:"next_wake"`
}

func (s *Server) handleListReminders(w http.ResponseWriter, r *http.Request) {
	rems, err := s.store.pendingReminders(r.Context())
	if err != nil {
		s.logger.Error("listing reminders", zap.Error(err))
		writeError(w, http.StatusInternalServerError, "reading reminders failed")
		return
	}
	out := reminderList{Pending: rems}
	if len(rems) > 0 {
		out.NextWake = &rems[0].At
	}
	writeJSON(w, http.StatusOK, out)
}

// wakeResult is the answer to a wake.
type wakeResult struct {
	Reason   string     `json:"reason"`
	Fired    int        `json:"fired"`
	NextWake *time.Time `json:"next_wake"`
}

// handleRootPost is the proxy's scheduled wake when its configured path is /.
func (s *Server) handleRootPost(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(WakeReasonHeader) == "" {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "POST / is only for wakes (header "+WakeReasonHeader+")")
		return
	}
	s.handleWake(w, r)
}

// handleWake delivers due reminders. The proxy sends it with
// X-Lchat-Wake-Reason: scheduled at the time the space left in next-wake; any
// reason (or none, on /api/wake) does the same, since delivering due
// reminders is always safe.
func (s *Server) handleWake(w http.ResponseWriter, r *http.Request) {
	reason := r.Header.Get(WakeReasonHeader)
	posted, err := s.fireDue(r.Context())
	if err != nil {
		s.writeWriteError(w, err)
		return
	}
	if len(posted) > 0 || reason != "" {
		s.logger.Info("wake", zap.String("reason", reason), zap.Int("reminders_fired", len(posted)))
	}
	out := wakeResult{Reason: reason, Fired: len(posted)}
	next, ok, err := s.store.nextReminder(r.Context())
	if err != nil {
		s.logger.Error("reading next reminder", zap.Error(err))
	} else if ok {
		out.NextWake = &next
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) writeWriteError(w http.ResponseWriter, err error) {
	if errors.Is(err, errClosed) {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.logger.Error("writing to database", zap.Error(err))
	writeError(w, http.StatusInternalServerError, "saving failed")
}

func isForm(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == "application/x-www-form-urlencoded"
}

// decodeJSON reads exactly one JSON object of at most MaxBodyBytes into dst,
// answering the client itself when it cannot.
func decodeJSON(w http.ResponseWriter, r *http.Request, dst any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			writeError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
			return false
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		writeBodyError(w, err)
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeBodyError(w, err)
			return false
		}
		writeError(w, http.StatusBadRequest, "malformed JSON: the body must hold a single JSON object")
		return false
	}
	return true
}

// writeBodyError explains why a request body could not be read.
func writeBodyError(w http.ResponseWriter, err error) {
	var (
		mbe  *http.MaxBytesError
		syn  *json.SyntaxError
		typ  *json.UnmarshalTypeError
		msg  string
		code = http.StatusBadRequest
	)
	switch {
	case errors.As(err, &mbe):
		code, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)
	case errors.Is(err, io.EOF):
		msg = "malformed JSON: the request body is empty"
	case errors.Is(err, io.ErrUnexpectedEOF):
		msg = "malformed JSON: the body ends early"
	case errors.As(err, &syn):
		msg = fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field != "" {
			msg = fmt.Sprintf("malformed JSON: field %q must be a %s", typ.Field, typ.Type)
		} else {
			msg = "malformed JSON: the body must be a JSON object"
		}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		msg = "malformed JSON: unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	default:
		msg = "malformed request body: " + err.Error()
	}
	writeError(w, code, msg)
}

// apiError is the body of every error answer.
type apiError struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		b = []byte(`{"error":"encoding the answer failed"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}
