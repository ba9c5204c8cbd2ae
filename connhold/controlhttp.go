package connhold

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
)

// Paths of the control endpoint, served by the box to one space's instance only.
const (
	SendPath  = "/.lchat/ws/send"  // POST ?conn=<id> or ?tag=<tag>: the body is the message(s), as in an answer
	ClosePath = "/.lchat/ws/close" // POST ?conn=<id>&code=<code>&reason=<text>
	SetPath   = "/.lchat/ws/set"   // POST ?conn=<id>: Lchat-Set-Tags, Lchat-Set-Meta, the auto-response headers
	ConnsPath = "/.lchat/ws/conns" // GET [?tag=<tag>]: the space's connections, JSON
)

// ControlHandler is the control endpoint of space: whoever reaches it acts as that space
// (the glue serves it only where the space's own instance can reach it, one listener per
// space), and another space's connection id is not found (404).
func (h *Hub) ControlHandler(space string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+SendPath, func(w http.ResponseWriter, r *http.Request) {
		rep, ok := readControl(w, r)
		if !ok {
			return
		}
		q := r.URL.Query()
		if tag := q.Get("tag"); tag != "" {
			n := 0
			for _, m := range rep.Messages {
				n = max(n, h.SendTag(space, tag, m))
			}
			writeJSON(w, map[string]int{"sent": n})
			return
		}
		id := q.Get("conn")
		c := h.lookup(space, id)
		if c == nil || !c.open() {
			http.Error(w, ErrUnknownConn.Error(), http.StatusNotFound)
			return
		}
		for _, m := range rep.Messages {
			if !c.send(m, false) {
				http.Error(w, ErrUnknownConn.Error(), http.StatusGone)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+ClosePath, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		code := CloseNormal
		if v := q.Get("code"); v != "" {
			var err error
			if code, err = strconv.Atoi(v); err != nil {
				http.Error(w, "bad code", http.StatusBadRequest)
				return
			}
		}
		reason := q.Get("reason")
		if len(reason) > 123 {
			http.Error(w, "reason over 123 bytes", http.StatusBadRequest)
			return
		}
		switch err := h.CloseConn(space, q.Get("conn"), code, reason); {
		case errors.Is(err, ErrUnknownConn):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	mux.HandleFunc("POST "+SetPath, func(w http.ResponseWriter, r *http.Request) {
		rep, ok := readControl(w, r)
		if !ok {
			return
		}
		if err := h.Set(space, r.URL.Query().Get("conn"), rep); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+ConnsPath, func(w http.ResponseWriter, r *http.Request) {
		list := h.List(space, r.URL.Query().Get("tag"))
		if list == nil {
			list = []ConnInfo{}
		}
		writeJSON(w, list)
	})
	return mux
}

// readControl reads a control request's body and headers as an answer (ParseReply).
func readControl(w http.ResponseWriter, r *http.Request) (Reply, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxAnswer+1))
	if err != nil || len(body) > MaxAnswer {
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return Reply{}, false
	}
	rep, err := ParseReply(r.Header, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return Reply{}, false
	}
	return rep, true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
