package connhold

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Across boxes (docs/connections.md, "Across boxes"). The box a client reached (its entry
// box) holds the client's socket; each event goes to wherever the space is awake. The box
// that delivers an event for another box's connection stamps the acknowledgement with the
// instance that took it (At) and a mark on its Relay, and tells the entry box when a
// checkpoint saved what was acknowledged (Notice). An entry box never takes a message
// for saved on a guess: an event for a connection whose earlier acknowledged messages are
// not known to be saved names where they were acknowledged (PriorHeader), and a box whose
// instance is another refuses it (ReplayHeader), so the entry box delivers those messages
// again, first and in order.

// Headers between boxes only: the entry box removes any a client sends (StripPeerHeaders),
// and a box trusts them only on a request validly marked as forwarded by a peer.
const (
	// EntryHeader, on a forwarded upgrade or event: the SELF of the box that holds the
	// client's socket. On an upgrade it asks the box with the instance to pass an opt-in
	// answer back instead of holding the connection itself.
	EntryHeader = "Lchat-Ws-Entry"
	// PriorHeader, on a forwarded event: one value per instance (At) that acknowledged
	// messages of this connection that no checkpoint is known to hold yet.
	PriorHeader = "Lchat-Ws-Prior"
	// On a forwarded event's 2xx answer: the instance that acknowledged it, its mark on
	// that box's Relay, and the highest mark there a completed checkpoint holds.
	AckAtHeader   = "Lchat-Ws-Ack-At"
	AckMarkHeader = "Lchat-Ws-Ack-Mark"
	CoveredHeader = "Lchat-Ws-Covered"
	// DurableHeader, on a 2xx answer to a forwarded event: the acknowledgement's commits
	// are in the bucket already (Reply.Durable).
	DurableHeader = "Lchat-Ws-Durable"
	// ReplayHeader, on a 409 answer to a forwarded event: the priors the box's instance is
	// not, one value each. The event was not delivered.
	ReplayHeader = "Lchat-Ws-Replay"
	// RefusedHeader, on a non-2xx answer to a forwarded event: the box refused it before
	// any instance saw it (not a redelivery when tried again).
	RefusedHeader = "Lchat-Ws-Refused"
	// ReopenHeader, on a forwarded request for server-sent events: the entry box reopens a
	// resumable stream it holds; a box where the space is not awake answers 409 at once
	// (a held stream never wakes its space).
	ReopenHeader = "Lchat-Sse-Reopen"
)

// StripPeerHeaders removes the box-to-box headers from a client's request.
func StripPeerHeaders(h map[string][]string) {
	for _, k := range []string{EntryHeader, PriorHeader, AckAtHeader, AckMarkHeader, CoveredHeader, DurableHeader, ReplayHeader, RefusedHeader, ReopenHeader} {
		delete(h, k)
	}
}

// At names one instance of a space: the box (its SELF), the box's process (its mesh
// incarnation) and the instance (engine.Use.Instance). The zero At is "not known".
type At struct {
	Box, Incarnation, Instance string
}

func (a At) String() string { return a.Box + " " + a.Incarnation + " " + a.Instance }

// ParseAt reads an At from its String.
func ParseAt(s string) (At, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return At{}, fmt.Errorf("instance name %q: want three fields", s)
	}
	return At{Box: f[0], Incarnation: f[1], Instance: f[2]}, nil
}

// IsZero reports whether a names no instance.
func (a At) IsZero() bool { return a == At{} }

// ReplayError is a Deliverer's answer when the instance that would take an event is not
// one that acknowledged the connection's earlier, unsaved messages (Stale): nothing was
// delivered, and the hub delivers those messages again first, marked as redeliveries.
type ReplayError struct {
	Stale []At
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("%d earlier instance(s) acknowledged messages not known to be saved: delivering them again first", len(e.Stale))
}

// StaleAt is the priors that are not now.
func StaleAt(prior []At, now At) []At {
	var out []At
	for _, p := range prior {
		if p != now {
			out = append(out, p)
		}
	}
	return out
}

// IsReplay reports whether err is a ReplayError, and returns it.
func IsReplay(err error) (*ReplayError, bool) {
	var re *ReplayError
	return re, errors.As(err, &re)
}

// Notice tells an entry box what became of the messages that instance At acknowledged
// for it: up to Covered they are saved by a completed checkpoint; Gone, the instance
// ended and what no checkpoint covers is not saved (deliver it again).
type Notice struct {
	Space   string `json:"space"`
	At      string `json:"at"`
	Covered uint64 `json:"covered,omitempty"`
	Gone    bool   `json:"gone,omitempty"`
}

// Relay is a box's record of the events it delivered to its own instances for
// connections other boxes hold: per space, the instance, a mark per acknowledgement with
// its time, and the entry boxes to send Notices to.
type Relay struct {
	mu     sync.Mutex
	spaces map[string]*relayed
}

type relayed struct {
	at      At
	clock   uint64
	acks    []relayAck // not yet covered, in mark order
	covered uint64
	entries map[string]struct{}
}

type relayAck struct {
	mark uint64
	at   time.Time
}

// maxRelayAcks bounds a space's uncovered marks: past it the oldest are forgotten, and
// the entry boxes redeliver what they cannot confirm (safe: the instance drops
// duplicates by sequence number).
const maxRelayAcks = 1 << 16

func (r *Relay) space(space string, at At) *relayed {
	if r.spaces == nil {
		r.spaces = make(map[string]*relayed)
	}
	s := r.spaces[space]
	if s == nil || s.at != at {
		s = &relayed{at: at, entries: make(map[string]struct{})}
		r.spaces[space] = s
	}
	return s
}

// Track records that entry holds connections of space, whose instance is at.
func (r *Relay) Track(space string, at At, entry string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.space(space, at).entries[entry] = struct{}{}
}

// Acked records an acknowledgement by instance at of an event entry sent, at now; it
// returns the acknowledgement's mark and the highest mark a checkpoint covers.
func (r *Relay) Acked(space string, at At, entry string, now time.Time) (mark, covered uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.space(space, at)
	s.entries[entry] = struct{}{}
	s.clock++
	if len(s.acks) >= maxRelayAcks {
		s.acks = slices.Delete(s.acks, 0, len(s.acks)/2)
	}
	s.acks = append(s.acks, relayAck{mark: s.clock, at: now})
	return s.clock, s.covered
}

// Checkpointed records that a checkpoint of space that started at started has completed:
// the marks acknowledged before it are covered. It returns the Notice and the entry boxes
// to send it to; ok is false when there is nothing new to tell.
func (r *Relay) Checkpointed(space string, started time.Time) (n Notice, entries []string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.spaces[space]
	if s == nil {
		return Notice{}, nil, false
	}
	i := 0
	for i < len(s.acks) && s.acks[i].at.Before(started) {
		s.covered = s.acks[i].mark
		i++
	}
	if i == 0 {
		return Notice{}, nil, false
	}
	s.acks = slices.Delete(s.acks, 0, i)
	return Notice{Space: space, At: s.at.String(), Covered: s.covered}, s.entryList(), true
}

// Ended records that space's instance has ended: saved, every acknowledgement is covered
// (a sleep whose final checkpoint succeeded); otherwise the uncovered ones are not saved
// (a crash). The space is forgotten.
func (r *Relay) Ended(space string, saved bool) (n Notice, entries []string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.spaces[space]
	if s == nil {
		return Notice{}, nil, false
	}
	delete(r.spaces, space)
	n = Notice{Space: space, At: s.at.String(), Covered: s.covered}
	if saved {
		n.Covered = s.clock
	} else {
		n.Gone = true
	}
	return n, s.entryList(), true
}

// Entries are the boxes holding connections of space's instance here.
func (r *Relay) Entries(space string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.spaces[space]; s != nil {
		return s.entryList()
	}
	return nil
}

func (s *relayed) entryList() []string {
	out := make([]string, 0, len(s.entries))
	for e := range s.entries {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}
