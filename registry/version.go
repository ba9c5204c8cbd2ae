package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Replication converges whatever the delivery order. Every route and every tombstone
// carries a revision, Rev, made by the box where the change was made (its issuer):
//
//	<16 hex digits: hybrid logical clock>-<origin>
//
// The clock is a hybrid logical clock: the issuer's wall time in milliseconds shifted
// left 16 bits, plus a counter, never lower than any revision the box has stored or
// received. So a box's later change always gets a higher revision than anything it had
// seen, whatever the wall clocks of the boxes say; revisions of concurrent changes on two
// boxes are ordered by time, then by origin. Revisions compare as strings.
//
// A box applies a replicated row only if its revision is higher than the row and the
// tombstone it holds for the host, and a tombstone only if its revision is at least the
// row's (a tombstone of exactly the revision a listing showed deletes that row and no
// later one: mesh-seed --prune) and higher than the tombstone it holds. Retries,
// duplicates and reordering then change nothing: an older row or tombstone never
// overrides a newer one, and a late PUT cannot resurrect a deleted host as long as its
// tombstone is remembered (TombstoneTTL, default 7 days). Rows without a revision (from
// a box that predates revisions) are applied as before, unconditionally.

// DefaultTombstoneTTL is how long a tombstone is remembered.
const DefaultTombstoneTTL = 7 * 24 * time.Hour

var tombstonesBucket = []byte("tombstones")

// tombstone is the memory of a deleted host.
type tombstone struct {
	Rev string    `json:"rev"`
	At  time.Time `json:"at"` // when this box stored it, for expiry
}

// ValidRev reports whether rev is a revision: 16 lowercase hex digits, a dash, an origin
// of 1 to 256 printable characters.
func ValidRev(rev string) bool {
	if len(rev) < 18 || len(rev) > 16+1+256 || rev[16] != '-' {
		return false
	}
	if _, err := strconv.ParseUint(rev[:16], 16, 64); err != nil || strings.ToLower(rev[:16]) != rev[:16] {
		return false
	}
	for _, c := range rev[17:] {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// RevTime is when the change of revision rev was made, by its issuer's clock (the
// hybrid logical clock's milliseconds); false for a value that is not a revision.
func RevTime(rev string) (time.Time, bool) {
	if !ValidRev(rev) {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(revClock(rev) >> 16)), true
}

func revClock(rev string) uint64 {
	if !ValidRev(rev) {
		return 0
	}
	n, _ := strconv.ParseUint(rev[:16], 16, 64)
	return n
}

// observeLocked advances the clock past rev. g.wmu must be held.
func (g *Registry) observeLocked(rev string) {
	if c := revClock(rev); c > g.hlc {
		g.hlc = c
	}
}

// nextRevLocked makes a revision higher than every one this registry has seen. g.wmu
// must be held.
func (g *Registry) nextRevLocked() string {
	c := uint64(g.now().UnixMilli()) << 16
	if c <= g.hlc {
		c = g.hlc + 1
	}
	g.hlc = c
	return fmt.Sprintf("%016x-%s", c, g.origin)
}

// newerRev reports whether a is a later revision than b ("" is the earliest).
func newerRev(a, b string) bool { return a > b }

// ErrStale means a replicated row or tombstone is older than what this box holds for the
// host: nothing changed. It is an answer, not a failure.
var ErrStale = errors.New("older than the row or tombstone held here")

// TombstoneRev returns the revision of host's tombstone, if this box remembers one.
func (g *Registry) TombstoneRev(host string) (string, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	t, ok := g.tombs[host]
	return t.Rev, ok
}

// Tombstones returns the remembered tombstones, host to revision (those without one
// left out).
func (g *Registry) Tombstones() map[string]string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make(map[string]string, len(g.tombs))
	for h, t := range g.tombs {
		if t.Rev != "" {
			out[h] = t.Rev
		}
	}
	return out
}

// ApplyRow stores a replicated row if its revision (required) is newer than the row and
// tombstone held for its host; otherwise it changes nothing and reports ErrStale.
func (g *Registry) ApplyRow(rt Route) (Route, error) {
	if !ValidRev(rt.Rev) {
		return Route{}, fmt.Errorf("route %s: invalid revision", rt.Host)
	}
	if err := rt.Validate(); err != nil {
		return Route{}, err
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	g.observeLocked(rt.Rev)
	if !newerRev(rt.Rev, g.heldRevLocked(rt.Host)) {
		return Route{}, ErrStale
	}
	stored := rt.clone()
	g.stampTimesLocked(stored)
	if err := g.writeLocked([]*Route{stored}); err != nil {
		return Route{}, err
	}
	return *stored.clone(), nil
}

// ApplyTombstone deletes host if rev (required) is at least the held row's revision and
// newer than any tombstone held, and remembers the tombstone; otherwise it changes
// nothing and reports ErrStale. It reports whether a row was deleted.
func (g *Registry) ApplyTombstone(host, rev string) (bool, error) {
	if !ValidRev(rev) {
		return false, fmt.Errorf("tombstone %s: invalid revision", host)
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	g.observeLocked(rev)
	g.mu.RLock()
	cur, had := g.routes[host]
	t, hadTomb := g.tombs[host]
	g.mu.RUnlock()
	if had && cur.Rev > rev || hadTomb && !newerRev(rev, t.Rev) {
		return false, ErrStale
	}
	return had, g.deleteLocked(host, rev)
}

// heldRevLocked is the newest revision held for host: its row's or its tombstone's.
func (g *Registry) heldRevLocked(host string) string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	rev := g.tombs[host].Rev
	if cur, ok := g.routes[host]; ok && newerRev(cur.Rev, rev) {
		rev = cur.Rev
	}
	return rev
}

// deleteLocked removes host's row (if any) and stores its tombstone, expiring old ones.
// g.wmu must be held.
func (g *Registry) deleteLocked(host, rev string) error {
	t := tombstone{Rev: rev, At: g.now().UTC()}
	expired := g.expiredLocked()
	err := g.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(routesBucket).Delete([]byte(host)); err != nil {
			return err
		}
		tb := tx.Bucket(tombstonesBucket)
		for _, h := range expired {
			if err := tb.Delete([]byte(h)); err != nil {
				return err
			}
		}
		v, err := json.Marshal(t)
		if err != nil {
			return err
		}
		return tb.Put([]byte(host), v)
	})
	if err != nil {
		return fmt.Errorf("writing registry: %v", err)
	}
	g.mu.Lock()
	delete(g.routes, host)
	for _, h := range expired {
		delete(g.tombs, h)
	}
	g.tombs[host] = t
	g.mu.Unlock()
	return nil
}

// expiredLocked lists the tombstones older than the TTL. g.wmu must be held.
func (g *Registry) expiredLocked() []string {
	cutoff := g.now().Add(-g.tombTTL)
	g.mu.RLock()
	defer g.mu.RUnlock()
	var out []string
	for h, t := range g.tombs {
		if t.At.Before(cutoff) {
			out = append(out, h)
		}
	}
	return out
}

// loadTombstones reads the remembered tombstones (in Open's transaction).
func (g *Registry) loadTombstones(tx *bolt.Tx) error {
	b, err := tx.CreateBucketIfNotExists(tombstonesBucket)
	if err != nil {
		return err
	}
	g.tombs = make(map[string]tombstone)
	return b.ForEach(func(k, v []byte) error {
		var t tombstone
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decoding tombstone %q: %v", k, err)
		}
		g.tombs[string(k)] = t
		g.observeLocked(t.Rev)
		return nil
	})
}

// PutUnversioned stores a replicated row that carries no revision (sent by a box that
// predates revisions) as such: unconditionally, with an empty revision, which any
// versioned change for the host then overrides. It makes no claim to be newer than
// anything, so it neither gets this box's revision nor clears a tombstone's memory.
func (g *Registry) PutUnversioned(rt Route) (Route, error) {
	rt.Rev = ""
	if err := rt.Validate(); err != nil {
		return Route{}, err
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	stored := g.stampTimesLocked(rt.clone())
	g.mu.RLock()
	t, hadTomb := g.tombs[rt.Host]
	g.mu.RUnlock()
	if err := g.writeLocked([]*Route{stored}); err != nil {
		return Route{}, err
	}
	if hadTomb { // writeLocked forgot it; an unversioned row does not outrank it
		if err := g.putTombLocked(rt.Host, t); err != nil {
			return Route{}, err
		}
	}
	return *stored.clone(), nil
}

// DeleteUnversioned removes host for a tombstone that carries no revision, without
// remembering a tombstone of its own (it has no revision to remember). It reports
// ErrNotFound when there was no row.
func (g *Registry) DeleteUnversioned(host string) error {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if _, ok := g.Lookup(host); !ok {
		return ErrNotFound
	}
	err := g.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(routesBucket).Delete([]byte(host))
	})
	if err != nil {
		return fmt.Errorf("writing registry: %v", err)
	}
	g.mu.Lock()
	delete(g.routes, host)
	g.mu.Unlock()
	return nil
}

// putTombLocked stores one tombstone as is. g.wmu must be held.
func (g *Registry) putTombLocked(host string, t tombstone) error {
	v, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := g.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(tombstonesBucket).Put([]byte(host), v) }); err != nil {
		return fmt.Errorf("writing registry: %v", err)
	}
	g.mu.Lock()
	g.tombs[host] = t
	g.mu.Unlock()
	return nil
}
