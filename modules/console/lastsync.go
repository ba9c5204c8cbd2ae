package console

import (
	"context"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// A box remembers a space's last sync only from its own checkpoints since it started:
// after a restart, or for a space that runs on another box, it has none. The console
// then shows when the space's manifest in the bucket was written (the last checkpoint
// any box made), which is what the next wake restores.

// syncMaxAge is how long one read of a space's manifest stands for its last sync.
const syncMaxAge = time.Minute

// syncReads bounds the manifest reads a page makes at once.
const syncReads = 8

// stored is one read of a space's manifest: when it was written, and whether it exists.
type stored struct {
	writtenAt time.Time
	ok        bool
	readAt    time.Time
}

// syncCache keeps the manifest reads of spaces the box has no memory of, so that the
// pages a burst of events refreshes read each manifest once a minute at most.
type syncCache struct {
	mu sync.Mutex
	m  map[string]stored // by host; guarded by mu
}

// fillLastSync sets the last sync of each space this box has no memory of (no sync here
// and no sync error) to its manifest's time, and returns the hosts it filled. A space
// never checkpointed, or whose manifest cannot be read, keeps none.
func (h *Handler) fillLastSync(ctx context.Context, spaces []fleetview.Space) map[string]bool {
	now := time.Now()
	c := h.syncs
	var todo []string
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string]stored)
	}
	for host, st := range c.m {
		if now.Sub(st.readAt) >= syncMaxAge {
			delete(c.m, host)
		}
	}
	for _, sp := range spaces {
		if _, ok := c.m[sp.Host]; !ok && unsynced(sp) {
			todo = append(todo, sp.Host)
		}
	}
	c.mu.Unlock()

	if len(todo) > 0 {
		var wg sync.WaitGroup
		sem := make(chan struct{}, syncReads)
		for _, host := range todo {
			sem <- struct{}{}
			safego.Go(&wg, h.logger, "console manifest read", func() {
				defer func() { <-sem }()
				st, ok, err := h.src.Stored(ctx, host)
				if err != nil {
					return // not kept: the next page tries again
				}
				c.mu.Lock()
				c.m[host] = stored{writtenAt: st.WrittenAt, ok: ok, readAt: now}
				c.mu.Unlock()
			})
		}
		wg.Wait()
	}

	filled := map[string]bool{}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range spaces {
		sp := &spaces[i]
		if st, ok := c.m[sp.Host]; ok && st.ok && unsynced(*sp) {
			sp.LastSync = st.writtenAt
			filled[sp.Host] = true
		}
	}
	return filled
}

// unsynced reports whether this box has no memory of sp's last sync.
func unsynced(sp fleetview.Space) bool { return sp.LastSync.IsZero() && sp.LastSyncError == "" }
