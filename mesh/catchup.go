package mesh

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/registry"
)

// Catch-up: a fan-out reaches the peers that are live and reachable when a change is
// made. A peer that was down, draining, restarting or cut off from this box then misses
// it, and no later write need come to fix it. So each box sends every peer what the peer
// lacks of its own registry: when it sees the peer come up (a new incarnation in its live
// view) and, in rotation, one live peer every Resync interval. What is sent is worked
// out from the peer's listing (GET /api/mesh/routes: its in-scope rows with their
// revisions): the rows this box holds at a newer revision, and this box's tombstones
// newer than the row the peer lists. The peer applies both by revision
// (registry/version.go), so a catch-up that crosses a newer change, or runs twice, or
// late, changes nothing wrong.

// CatchUpPlan works out what peer m lacks of this box's registry: local is this box's
// rows, tombs its remembered tombstones (host to revision), listed the rows m lists (its
// in-scope rows with revisions). puts are the local rows in m's scope that m lists at an
// older revision, or not at all if the row changed since horizon; tombstones are the
// hosts m lists at a revision older than this box's tombstone, at that tombstone's
// revision. Both sorted by host.
//
// horizon is now minus the tombstone TTL: a peer that lacks a host may have deleted it,
// and remembers that only for the TTL. A row older than that is not sent to a peer that
// lacks it (a box back after longer than the TTL must not bring deleted hosts back);
// mesh-seed gives a new box the old rows.
func CatchUpPlan(local []RouteRow, tombs map[string]string, listed []RouteRow, m Member, horizon time.Time) (puts []RouteRow, tombstones []Tombstone) {
	peerRev := make(map[string]string, len(listed))
	for _, r := range listed {
		peerRev[NormalizeHost(r.Host)] = r.Rev
	}
	for _, r := range local {
		h := NormalizeHost(r.Host)
		if !RouteInScope(h, r.HomeRegion, m.Domains, m.Region) {
			continue
		}
		rev, listedThere := peerRev[h]
		switch {
		case listedThere && r.Rev > rev:
			puts = append(puts, r)
		case !listedThere:
			if at, ok := registry.RevTime(r.Rev); ok && !at.Before(horizon) {
				puts = append(puts, r)
			}
		}
	}
	for h, t := range tombs {
		if rev, ok := peerRev[h]; ok && t > rev {
			tombstones = append(tombstones, Tombstone{Host: h, Rev: t})
		}
	}
	sort.Slice(puts, func(i, j int) bool { return puts[i].Host < puts[j].Host })
	sort.Slice(tombstones, func(i, j int) bool { return tombstones[i].Host < tombstones[j].Host })
	return puts, tombstones
}

// CatchUpPeer is what a catch-up needs of a peer's mesh API (*Client).
type CatchUpPeer interface {
	SeedPeer
	ListRoutes(ctx context.Context, base string) ([]RouteRow, error)
}

// CatchUp runs catch-ups from this box to its peers (see CatchUpPlan).
type CatchUp struct {
	Node *Node
	Peer CatchUpPeer
	// Rows is this box's registry in replicated form (Node.Rows); Tombs its tombstones.
	Rows  func() ([]RouteRow, error)
	Tombs func() map[string]string
	// Check is how often the live view is looked at for peers that came up. Default 1s.
	Check time.Duration
	// Resync is how often one live peer, in rotation, is caught up anyway (a peer that
	// stayed live but could not be reached). Default 1m.
	Resync time.Duration
	// TombstoneTTL is how long peers remember a delete (registry.DefaultTombstoneTTL when
	// zero): rows older than that are not sent to a peer that lacks them.
	TombstoneTTL time.Duration
	Logger       *zap.Logger

	mu      sync.Mutex
	done    map[string]string // peer Self -> incarnation caught up
	running map[string]bool
	next    int // rotation for Resync

	runs, puts, tombstones, failures atomic.Uint64
}

// CatchUpStats counts catch-up work; every field only grows.
type CatchUpStats struct {
	Runs       uint64 `json:"runs"`
	Puts       uint64 `json:"puts"`
	Tombstones uint64 `json:"tombstones"`
	Failures   uint64 `json:"failures"`
}

// Stats returns the counters.
func (c *CatchUp) Stats() CatchUpStats {
	return CatchUpStats{Runs: c.runs.Load(), Puts: c.puts.Load(), Tombstones: c.tombstones.Load(), Failures: c.failures.Load()}
}

// Run catches peers up until ctx ends.
func (c *CatchUp) Run(ctx context.Context) {
	check, resync := c.Check, c.Resync
	if check <= 0 {
		check = time.Second
	}
	if resync <= 0 {
		resync = time.Minute
	}
	tick := time.NewTicker(check)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.Tick(ctx, time.Since(last) >= resync)
		if time.Since(last) >= resync {
			last = time.Now()
		}
	}
}

// Tick starts a catch-up, in the background, of every live peer whose incarnation has
// not been caught up yet, and with rotate also of the next live peer in rotation.
func (c *CatchUp) Tick(ctx context.Context, rotate bool) {
	var peers []Member
	for _, m := range c.Node.Live() {
		if m.Self != c.Node.Self && !m.Draining {
			peers = append(peers, m)
		}
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].Self < peers[j].Self })
	c.mu.Lock()
	if c.done == nil {
		c.done, c.running = map[string]string{}, map[string]bool{}
	}
	var start []Member
	for _, m := range peers {
		if inc, ok := c.done[m.Self]; (!ok || inc != m.Incarnation) && !c.running[m.Self] {
			start = append(start, m)
		}
	}
	if rotate && len(peers) > 0 {
		m := peers[c.next%len(peers)]
		c.next++
		if !c.running[m.Self] && !containsSelf(start, m.Self) {
			start = append(start, m)
		}
	}
	for _, m := range start {
		c.running[m.Self] = true
	}
	c.mu.Unlock()
	for _, m := range start {
		safego.Go(nil, c.Logger, "mesh catch-up", func() {
			ok := c.Once(ctx, m)
			c.mu.Lock()
			delete(c.running, m.Self)
			if ok {
				c.done[m.Self] = m.Incarnation
			}
			c.mu.Unlock()
		})
	}
}

func containsSelf(ms []Member, self string) bool {
	for _, m := range ms {
		if m.Self == self {
			return true
		}
	}
	return false
}

// Once catches m up now and reports whether everything it needed arrived.
func (c *CatchUp) Once(ctx context.Context, m Member) bool {
	c.runs.Add(1)
	log := c.Logger
	if log == nil {
		log = zap.NewNop()
	}
	listed, err := c.Peer.ListRoutes(ctx, m.Self)
	if err != nil {
		c.failures.Add(1)
		log.Debug("mesh catch-up: listing the peer's routes", zap.String("peer", m.Self), zap.Error(err))
		return false
	}
	local, err := c.Rows()
	if err != nil {
		c.failures.Add(1)
		log.Warn("mesh catch-up: reading this box's routes", zap.Error(err))
		return false
	}
	ttl := c.TombstoneTTL
	if ttl <= 0 {
		ttl = registry.DefaultTombstoneTTL
	}
	puts, tombs := CatchUpPlan(local, c.Tombs(), listed, m, time.Now().Add(-ttl))
	if len(puts)+len(tombs) == 0 {
		return true
	}
	fails := RunSeed(ctx, c.Peer, m.Self, puts, tombs, len(listed), func(SeedEvent) {})
	c.puts.Add(uint64(len(puts)))
	c.tombstones.Add(uint64(len(tombs)))
	c.failures.Add(uint64(fails))
	log.Info("mesh catch-up: sent a peer the changes it lacked", zap.String("peer", m.Self),
		zap.Int("rows", len(puts)), zap.Int("tombstones", len(tombs)), zap.Int("failures", fails))
	return fails == 0
}
