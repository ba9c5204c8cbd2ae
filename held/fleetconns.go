package held

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/lchat/lchat-caddy/connhold"
)

// The WebSockets a fleet's entry boxes hold for a hosted space, as the provider's box
// knows them (docs/providers.md, "Held connections of a delegated space"), so that the
// space's instance lists them, counts them in a tag send and is told 404 for a connection
// no box holds, as across the boxes of one mesh (docs/connections.md, "Across boxes").
// Each entry box's pull carries a listing of what it holds of the space (pullListing);
// between pulls this box overlays what it sees of those connections itself: an upgrade
// its instance opted in, an event (each names its connection's tags and metadata), a
// change an answer or a control call made, a close.

const (
	// maxListingBytes bounds a pull's listing, as the entry box sends it (past it the
	// listing is cut and marked partial) and as the provider's box reads it.
	maxListingBytes = 4 << 20
	// listingKeep is how long an entry box's last listing counts once its pulls stop.
	listingKeep = 30 * time.Second
	// seenKeep is how long what this box saw of a connection counts.
	seenKeep = time.Minute
	// listingLag is how long before a listing came what this box saw may have happened
	// after the listing was taken: that listing does not override it.
	listingLag = 10 * time.Second
	// maxSeen bounds the connections seen per entry box and space.
	maxSeen = 1 << 16
)

// pullListing is a pull's body: the WebSockets its entry box holds of the space.
type pullListing struct {
	Conns []connhold.ConnInfo `json:"conns"`
	// Partial: the listing was cut at its bound; a connection it leaves out may be held.
	Partial bool `json:"partial,omitempty"`
}

// listingOf is list as a pull's body, cut to maxListingBytes.
func listingOf(list []connhold.ConnInfo) []byte {
	l := pullListing{Conns: make([]connhold.ConnInfo, 0, len(list))}
	size := 64
	for _, ci := range list {
		b, err := json.Marshal(ci)
		if err != nil {
			continue
		}
		if size += len(b) + 1; size > maxListingBytes {
			l.Partial = true
			break
		}
		l.Conns = append(l.Conns, ci)
	}
	out, _ := json.Marshal(l)
	return out
}

// errListingTooLarge is a pull's listing past maxListingBytes.
var errListingTooLarge = errors.New("a pull's listing over its bound")

// readListing reads a pull's body: a fleet's word, checked as such. A connection that
// breaks the contract's limits is left out and the listing marked partial.
func readListing(r io.Reader) (pullListing, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxListingBytes+1))
	if err != nil {
		return pullListing{}, fmt.Errorf("reading a pull's listing: %v", err)
	}
	if len(b) > maxListingBytes {
		return pullListing{}, errListingTooLarge
	}
	var l pullListing
	if err := json.Unmarshal(b, &l); err != nil {
		return pullListing{}, fmt.Errorf("a pull's listing: %v", err)
	}
	l.Conns = slices.DeleteFunc(l.Conns, func(ci connhold.ConnInfo) bool {
		ok := connhold.ValidID(ci.ID) && len(ci.Tags) <= connhold.MaxTags && len(ci.Meta) <= connhold.MaxMeta && ci.Pending >= 0 &&
			!slices.ContainsFunc(ci.Tags, func(t string) bool { return t == "" || len(t) > connhold.MaxTagLen })
		switch ci.State {
		case "open", "closing", "gone", "done":
		default:
			ok = false
		}
		if !ok {
			l.Partial = true
		}
		return !ok
	})
	return l, nil
}

// fleetConns is what the provider's box knows of the WebSockets one fleet entry box
// holds of a space (that entry box's outbox). Guarded by outboxes.mu.
type fleetConns struct {
	listed   map[string]connhold.ConnInfo // by id: its last pull's listing
	partial  bool                         // that listing was cut
	listedAt time.Time                    // when it came; zero before any
	seen     map[string]seenConn          // by id: what this box saw of them since
}

// seenConn is a connection as this box last saw it.
type seenConn struct {
	info connhold.ConnInfo
	gone bool
	at   time.Time
}

// connChange is what this box saw of a connection: its tags or metadata set, or its end.
type connChange struct {
	tags *[]string
	meta *[]byte
	gone bool
}

// changeOf is the change an answer's header makes (connhold.ParseReply); none when it is
// malformed (the entry box refuses it too).
func changeOf(h http.Header) connChange {
	r, err := connhold.ParseReply(h, nil)
	if err != nil {
		return connChange{}
	}
	return connChange{tags: r.SetTags, meta: r.SetMeta, gone: r.CloseCode != 0}
}

// take makes l the listing, come at now; what was seen before it by more than
// listingLag is its past.
func (f *fleetConns) take(l pullListing, now time.Time) {
	f.listed = make(map[string]connhold.ConnInfo, len(l.Conns))
	for _, ci := range l.Conns {
		f.listed[ci.ID] = ci
	}
	f.partial, f.listedAt = l.Partial, now
	for id, s := range f.seen {
		if !f.counts(s, now) {
			delete(f.seen, id)
		}
	}
}

// counts reports whether s still says more than the listing.
func (f *fleetConns) counts(s seenConn, now time.Time) bool {
	return now.Sub(s.at) < seenKeep && !s.at.Before(f.listedAt.Add(-listingLag))
}

// saw notes ch, seen at now, of connection id.
func (f *fleetConns) saw(id string, ch connChange, now time.Time) {
	if f.seen == nil {
		f.seen = make(map[string]seenConn)
	}
	s, ok := f.seen[id]
	if !ok || !f.counts(s, now) {
		if !ok && len(f.seen) >= maxSeen {
			for k, o := range f.seen {
				if !f.counts(o, now) {
					delete(f.seen, k)
				}
			}
			if len(f.seen) >= maxSeen {
				return
			}
		}
		s = seenConn{info: connhold.ConnInfo{ID: id, Tags: []string{}, State: "open"}}
		if li, ok := f.listed[id]; ok {
			s.info = li
		}
	}
	if s.gone {
		return // an id is never held again
	}
	if ch.tags != nil {
		s.info.Tags = *ch.tags
	}
	if ch.meta != nil {
		s.info.Meta = *ch.meta
	}
	if ch.gone {
		s.gone, s.info.State = true, "gone"
	}
	s.at = now
	f.seen[id] = s
}

// listingLive reports whether ob's entry box's last listing counts at now: a pull of it
// is open, or ended less than listingKeep ago.
func (ob *outbox) listingLive(now time.Time) bool {
	return ob.fleet.listedAt != (time.Time{}) && (ob.pulls > 0 || now.Sub(ob.pulledAt) < listingKeep)
}

// lookupLocked is connection id as ob's entry box holds it, as known at now.
func (ob *outbox) lookupLocked(id string, now time.Time) (connhold.ConnInfo, bool) {
	f := &ob.fleet
	if s, ok := f.seen[id]; ok && f.counts(s, now) {
		return s.info, !s.gone
	}
	if ob.listingLive(now) {
		ci, ok := f.listed[id]
		return ci, ok
	}
	return connhold.ConnInfo{}, false
}

// viewLocked is every connection ob's entry box holds as known at now, and whether
// some may be left out (its listing was cut).
func (ob *outbox) viewLocked(now time.Time) (conns []connhold.ConnInfo, partial bool) {
	f := &ob.fleet
	live := ob.listingLive(now)
	if live {
		for id, ci := range f.listed {
			if s, ok := f.seen[id]; ok && f.counts(s, now) {
				continue
			}
			conns = append(conns, ci)
		}
	}
	for _, s := range f.seen {
		if !s.gone && f.counts(s, now) {
			conns = append(conns, s.info)
		}
	}
	return conns, live && f.partial
}

// sawConn notes ch, a change of connection id of host held by the fleet entry box entry
// that this box saw (an upgrade, an event, an answer, its instance's control call).
func (c *Conns) sawConn(host, entry, id string, ch connChange) {
	if !isClientEntry(entry) || !connhold.ValidID(id) {
		return
	}
	now := time.Now()
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	c.out.touchLocked(host, entry, now).fleet.saw(id, ch, now)
}

// fleetHolders are the fleet entry boxes that hold host's connection id open, as this
// box knows at now; when none does, those whose listing was cut (one may hold it).
func (c *Conns) fleetHolders(host, id string, now time.Time) []string {
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	var held, maybe []string
	for e, ob := range c.out.by[host] {
		if ci, ok := ob.lookupLocked(id, now); ok && ci.State == "open" {
			held = append(held, e)
		} else if ob.listingLive(now) && ob.fleet.partial {
			maybe = append(maybe, e)
		}
	}
	if len(held) > 0 {
		return held
	}
	return maybe
}

// fleetList is host's connections the fleets' entry boxes hold (with tag, those that
// have it), as this box knows at now.
func (c *Conns) fleetList(host, tag string, now time.Time) []connhold.ConnInfo {
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	var out []connhold.ConnInfo
	for _, ob := range c.out.by[host] {
		conns, _ := ob.viewLocked(now)
		for _, ci := range conns {
			if tag == "" || slices.Contains(ci.Tags, tag) {
				out = append(out, ci)
			}
		}
	}
	return out
}

// fleetCount is how many of host's connections the fleets' entry boxes hold open with
// tag, as this box knows at now: what a tag send reaches there.
func (c *Conns) fleetCount(host, tag string, now time.Time) int {
	n := 0
	for _, ci := range c.fleetList(host, tag, now) {
		if ci.State == "open" {
			n++
		}
	}
	return n
}
