package demospace

import (
	_ "embed"
	"html/template"
	"net/http"

	"go.uber.org/zap"
)

//go:embed page.html
var pageHTML string

var pageTmpl = template.Must(template.New("page").Parse(pageHTML))

// pageData is what page.html renders.
type pageData struct {
	Host     string
	Messages []Message
	LastID   int64
	Pending  []Reminder
	// Hold: the box holds the room's connections across its sleeps (Config.Hold), so
	// the page can say that an open tab stays connected while the room sleeps.
	Hold bool
}

// handlePage renders the room: a line on what the demo shows, the latest messages (or a
// line saying there are none yet), the forms, and a script that follows /api/events
// from the last rendered id. Everything is inline.
func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	msgs, err := s.store.messages(r.Context(), -1, defaultListLimit)
	if err != nil {
		s.logger.Error("listing messages", zap.Error(err))
		http.Error(w, "reading messages failed", http.StatusInternalServerError)
		return
	}
	rems, err := s.store.pendingReminders(r.Context())
	if err != nil {
		s.logger.Error("listing reminders", zap.Error(err))
		http.Error(w, "reading reminders failed", http.StatusInternalServerError)
		return
	}
	d := pageData{Host: s.host, Messages: msgs, Pending: rems, Hold: s.hold}
	if d.Host == "" {
		d.Host = "demo space"
	}
	if n := len(msgs); n > 0 {
		d.LastID = msgs[n-1].ID
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	if err := pageTmpl.Execute(w, d); err != nil {
		s.logger.Debug("writing page", zap.Error(err))
	}
}
