package connhold

import (
	"errors"
	"slices"
)

// The control operations an instance calls on its own space's connections (the control
// endpoint decodes a request and calls one of these). Every one takes the caller's space:
// another space's connection id is not found.

// ErrUnknownConn: no open connection of this space has that id.
var ErrUnknownConn = errors.New("no such connection")

// Send sends m to space's connection id.
func (h *Hub) Send(space, id string, m Message) error {
	c := h.lookup(space, id)
	if c == nil || !c.send(m, false) {
		return ErrUnknownConn
	}
	return nil
}

// SendTag sends m to every open connection of space that has tag, and returns how many.
func (h *Hub) SendTag(space, tag string, m Message) int {
	n := 0
	for _, c := range h.spaceConnsOf(space) {
		c.mu.Lock()
		has := slices.Contains(c.tags, tag)
		c.mu.Unlock()
		if has && c.send(m, false) {
			n++
		}
	}
	return n
}

// CloseConn closes space's connection id with code and reason.
func (h *Hub) CloseConn(space, id string, code int, reason string) error {
	c := h.lookup(space, id)
	if c == nil || !c.open() {
		return ErrUnknownConn
	}
	if !sendableCode(code) {
		return errors.New("not a close code one may send")
	}
	c.closeWith(code, reason)
	return nil
}

// Set applies r's tags, metadata and auto-response to space's connection id (its
// messages and close, if any, are sent too).
func (h *Hub) Set(space, id string, r Reply) error {
	c := h.lookup(space, id)
	if c == nil {
		return ErrUnknownConn
	}
	c.mu.Lock()
	c.applyLocked(r)
	c.mu.Unlock()
	c.sendReply(r, false)
	return nil
}

// ConnInfo describes one held connection.
type ConnInfo struct {
	ID      string   `json:"id"`
	Tags    []string `json:"tags"`
	Meta    []byte   `json:"meta,omitempty"`
	State   string   `json:"state"`
	Parked  bool     `json:"parked"`
	Pending int      `json:"pending"`
	LastSeq uint64   `json:"last_seq"`
}

// List describes space's connections (with tag, those that have it).
func (h *Hub) List(space, tag string) []ConnInfo {
	var out []ConnInfo
	for _, c := range h.spaceConnsOf(space) {
		c.mu.Lock()
		if tag == "" || slices.Contains(c.tags, tag) {
			out = append(out, ConnInfo{ID: c.id, Tags: c.tags, Meta: c.meta, State: c.state.String(),
				Parked: c.parked, Pending: len(c.pending), LastSeq: c.nextSeq})
		}
		c.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ConnInfo) int {
		if a.ID < b.ID {
			return -1
		}
		return 1
	})
	return out
}
