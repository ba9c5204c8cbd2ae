package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ErrNotFound means no route exists for the host.
var ErrNotFound = errors.New("route not found")

// ErrExists means Create found a route for the host already.
var ErrExists = errors.New("route exists")

var routesBucket = []byte("routes")

// Registry is the store of routes. Writes go to disk first, then to memory; reads on
// the request path come from memory only. Safe for concurrent use.
type Registry struct {
	db  *bolt.DB
	now func() time.Time

	// wmu serializes writers so the disk order and the memory order agree.
	wmu sync.Mutex

	// mu guards routes. The writer (under wmu) replaces entries; a stored *Route is
	// never modified after it is published, so readers may keep it.
	mu     sync.RWMutex
	routes map[string]*Route
	tombs  map[string]tombstone // remembered deletes (version.go)

	// hlc is the last revision clock issued or seen; origin names this box in the
	// revisions it issues; tombTTL bounds how long a tombstone is remembered. hlc is
	// written with wmu held.
	hlc     uint64
	origin  string
	tombTTL time.Duration
}

// Options tune Open.
type Options struct {
	// Timeout bounds the wait for the file lock (another process holding the
	// registry). Default 2s.
	Timeout time.Duration
	// Now is the clock for Created/Updated and for revisions. Default time.Now.
	Now func() time.Time
	// Origin names this box in the revisions of its changes (version.go): the mesh
	// SELF. Default "local".
	Origin string
	// TombstoneTTL is how long a deleted host's tombstone is remembered, so a late
	// replicated row cannot bring it back. Default DefaultTombstoneTTL.
	TombstoneTTL time.Duration
}

// Open opens (creating if needed) the registry file at path and loads every route
// into memory.
func Open(path string, opts Options) (*Registry, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Origin == "" {
		opts.Origin = "local"
	}
	if opts.TombstoneTTL <= 0 {
		opts.TombstoneTTL = DefaultTombstoneTTL
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating registry directory: %v", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("opening registry %s: locked by another process", path)
		}
		return nil, fmt.Errorf("opening registry %s: %v", path, err)
	}
	g := &Registry{db: db, now: opts.Now, origin: opts.Origin, tombTTL: opts.TombstoneTTL}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(routesBucket)
		if err != nil {
			return err
		}
		g.routes = make(map[string]*Route, b.Stats().KeyN)
		err = b.ForEach(func(k, v []byte) error {
			rt := new(Route)
			if err := json.Unmarshal(v, rt); err != nil {
				return fmt.Errorf("decoding route %q: %v", k, err)
			}
			if !rt.Hibernate && rt.LivesAt != "" {
				// Rows replicated before lives_at rows were valid on their own carried
				// the peer's address as their upstream; it must never be dialed.
				rt.Upstream = ""
			}
			g.routes[rt.Host] = rt
			g.observeLocked(rt.Rev)
			return nil
		})
		if err != nil {
			return err
		}
		return g.loadTombstones(tx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("loading registry %s: %v", path, err)
	}
	return g, nil
}

// Path is the registry file.
func (g *Registry) Path() string { return g.db.Path() }

// Close closes the file. Lookups keep answering from memory.
func (g *Registry) Close() error { return g.db.Close() }

// Lookup returns the route for host from memory. The result is shared: do not modify it.
func (g *Registry) Lookup(host string) (*Route, bool) {
	g.mu.RLock()
	rt, ok := g.routes[host]
	g.mu.RUnlock()
	return rt, ok
}

// Len is the number of routes.
func (g *Registry) Len() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.routes)
}

// Get returns a copy of the route for host.
func (g *Registry) Get(host string) (Route, error) {
	rt, ok := g.Lookup(host)
	if !ok {
		return Route{}, ErrNotFound
	}
	return *rt.clone(), nil
}

// Put validates and stores rt, creating or replacing the route for rt.Host. Created
// is kept from an existing route; Updated is now. It returns the stored route.
func (g *Registry) Put(rt Route) (Route, error) {
	if err := rt.Validate(); err != nil {
		return Route{}, err
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	stored := g.stampLocked(rt.clone())
	if err := g.writeLocked([]*Route{stored}); err != nil {
		return Route{}, err
	}
	return *stored.clone(), nil
}

// Create validates and stores rt only if no route for rt.Host exists; otherwise it
// reports ErrExists and stores nothing. The check and the write happen under the
// writers' lock, so of concurrent Creates for one host exactly one succeeds.
func (g *Registry) Create(rt Route) (Route, error) {
	if err := rt.Validate(); err != nil {
		return Route{}, err
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if _, ok := g.Lookup(rt.Host); ok {
		return Route{}, fmt.Errorf("route %s: %w", rt.Host, ErrExists)
	}
	stored := g.stampLocked(rt.clone())
	if err := g.writeLocked([]*Route{stored}); err != nil {
		return Route{}, err
	}
	return *stored.clone(), nil
}

// PutMany stores many routes in one transaction; all are validated first and none is
// stored if any is invalid.
func (g *Registry) PutMany(rts []Route) error {
	for i := range rts {
		if err := rts[i].Validate(); err != nil {
			return err
		}
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	stored := make([]*Route, len(rts))
	for i := range rts {
		stored[i] = g.stampLocked(rts[i].clone())
	}
	return g.writeLocked(stored)
}

// Update applies fn to a copy of the route for host and stores the result.
func (g *Registry) Update(host string, fn func(*Route) error) (Route, error) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	cur, ok := g.Lookup(host)
	if !ok {
		return Route{}, ErrNotFound
	}
	rt := cur.clone()
	if err := fn(rt); err != nil {
		return Route{}, err
	}
	rt.Host = host
	if err := rt.Validate(); err != nil {
		return Route{}, err
	}
	stored := g.stampLocked(rt)
	if err := g.writeLocked([]*Route{stored}); err != nil {
		return Route{}, err
	}
	return *stored.clone(), nil
}

// stampLocked gives rt, a change made on this box, a new revision and sets its times
// from the existing route. g.wmu must be held.
func (g *Registry) stampLocked(rt *Route) *Route {
	rt.Rev = g.nextRevLocked()
	return g.stampTimesLocked(rt)
}

// stampTimesLocked sets the times of rt from the existing route. g.wmu must be held.
func (g *Registry) stampTimesLocked(rt *Route) *Route {
	now := g.now().UTC()
	g.mu.RLock()
	cur, ok := g.routes[rt.Host]
	g.mu.RUnlock()
	if ok {
		rt.Created = cur.Created
	} else if rt.Created.IsZero() {
		rt.Created = now
	}
	rt.Updated = now
	return rt
}

// writeLocked persists rts and then publishes them in memory. g.wmu must be held.
func (g *Registry) writeLocked(rts []*Route) error {
	err := g.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(routesBucket)
		tb := tx.Bucket(tombstonesBucket)
		for _, rt := range rts {
			v, err := json.Marshal(rt)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(rt.Host), v); err != nil {
				return err
			}
			if err := tb.Delete([]byte(rt.Host)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing registry: %v", err)
	}
	g.mu.Lock()
	for _, rt := range rts {
		g.routes[rt.Host] = rt
		delete(g.tombs, rt.Host)
	}
	g.mu.Unlock()
	return nil
}

// Delete removes the route for host. It reports ErrNotFound when there was none.
func (g *Registry) Delete(host string) error {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if _, ok := g.Lookup(host); !ok {
		return ErrNotFound
	}
	// A delete made here is remembered with a new revision: its tombstone is what
	// replicates (TombstoneRev), and an older row arriving late cannot undo it.
	return g.deleteLocked(host, g.nextRevLocked())
}

// List returns up to limit routes in host order, starting after the host `after`
// (exclusive; "" starts at the beginning), and the cursor for the next page ("" when
// this page is the last).
func (g *Registry) List(after string, limit int) ([]Route, string, error) {
	if limit <= 0 {
		limit = 100
	}
	var out []Route
	next := ""
	err := g.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(routesBucket).Cursor()
		var k, v []byte
		if after == "" {
			k, v = c.First()
		} else {
			k, v = c.Seek([]byte(after))
			if k != nil && string(k) == after {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			if len(out) == limit {
				next = out[len(out)-1].Host
				break
			}
			var rt Route
			if err := json.Unmarshal(v, &rt); err != nil {
				return fmt.Errorf("decoding route %q: %v", k, err)
			}
			out = append(out, rt)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("listing registry: %v", err)
	}
	return out, next, nil
}
