package engine

import (
	"context"
	"slices"
	"sync"
)

// startGate admits instance starts at most n at a time, in the order their wakes began
// (the first request of each). A start is CPU: the exec, the app's package inits, its
// database open and first answer. In a storm of wakes on a box with few cores, letting
// every start run at once has them all share the cores and all answer late, together;
// admitting them in order has the first requests answered first at the same total rate,
// and leaves the box's own goroutines (leases, restores, the proxy) CPU to run.
// Everything before the start (admission, lease, restore, fence) is not gated: it waits
// on the bucket, not on the cores.
type startGate struct {
	n int // slots; set once by New

	mu      sync.Mutex
	busy    int
	waiting []*gateWaiter // by ticket, lowest first
}

type gateWaiter struct {
	ticket uint64
	admit  chan struct{} // closed when the waiter holds a slot
}

// enter waits for a slot, behind every waiter with a lower ticket. The returned release
// gives the slot back (idempotent); on a ctx error no slot is held.
func (g *startGate) enter(ctx context.Context, ticket uint64) (release func(), err error) {
	g.mu.Lock()
	if g.busy < g.n && len(g.waiting) == 0 {
		g.busy++
		g.mu.Unlock()
		return sync.OnceFunc(g.leave), nil
	}
	w := &gateWaiter{ticket: ticket, admit: make(chan struct{})}
	i, _ := slices.BinarySearchFunc(g.waiting, ticket, func(w *gateWaiter, t uint64) int {
		switch {
		case w.ticket < t:
			return -1
		case w.ticket > t:
			return 1
		}
		return 0
	})
	g.waiting = slices.Insert(g.waiting, i, w)
	g.mu.Unlock()
	select {
	case <-w.admit:
		return sync.OnceFunc(g.leave), nil
	case <-ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.waiting, w); i >= 0 {
			g.waiting = slices.Delete(g.waiting, i, i+1)
			g.mu.Unlock()
			return nil, ctx.Err()
		}
		g.mu.Unlock()
		g.leave() // admitted meanwhile: pass the slot on
		return nil, ctx.Err()
	}
}

// leave frees a slot, handing it to the lowest waiting ticket.
func (g *startGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) > 0 {
		w := g.waiting[0]
		g.waiting = slices.Delete(g.waiting, 0, 1)
		close(w.admit) // the slot moves to w: busy is unchanged
		return
	}
	g.busy--
}
