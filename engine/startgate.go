package engine

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// startGate admits instance starts at most n at a time, in the order their wakes began
// (the first request of each). A start is CPU: the exec, the app's package inits, its
// database open and first answer. In a storm of wakes on a box with few cores, letting
// every start run at once has them all share the cores and all answer late, together;
// admitting them in order has the first requests answered first at the same total rate,
// and leaves the box's own goroutines (leases, restores, the proxy) CPU to run.
// Everything before the start (admission, lease, restore, fence) is not gated: it waits
// on the bucket, not on the cores.
//
// The order covers the wakes still before the gate too. Their bucket calls end in the
// bucket's order, not the wakes' (a file bucket's fsyncs finish as the disk has them), so
// a slot that frees while a lower ticket is still restoring is kept for it, for at most
// hold from that wake's begin: one slow bucket call delays the starts behind it by no
// more than that, and never stalls the box.
type startGate struct {
	n    int              // slots; set once by New
	hold time.Duration    // how long a slot waits for a lower ticket still before the gate
	now  func() time.Time // the engine's clock (Config.Now)

	mu      sync.Mutex
	busy    int
	waiting []*gateWaiter // at the gate, by ticket, lowest first
	ahead   []gateAhead   // begun and not at the gate yet, by ticket, lowest first
	timer   *time.Timer   // dispatches again when the oldest hold ends
}

type gateWaiter struct {
	ticket uint64
	admit  chan struct{} // closed when the waiter holds a slot
}

// gateAhead is a wake that has begun and not reached the gate.
type gateAhead struct {
	ticket uint64
	since  time.Time
}

// defaultStartHold is startGate.hold unless set: a restore of a small space on a bucket
// on the same machine takes a few milliseconds, and under a storm tens.
const defaultStartHold = 50 * time.Millisecond

// begin records that the wake with ticket has begun: until it reaches the gate (enter)
// or ends before it (end), a free slot is kept for it rather than given to a higher
// ticket, for at most hold.
func (g *startGate) begin(ticket uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, _ := slices.BinarySearchFunc(g.ahead, ticket, func(a gateAhead, t uint64) int { return cmp.Compare(a.ticket, t) })
	g.ahead = slices.Insert(g.ahead, i, gateAhead{ticket: ticket, since: g.now()})
}

// end records that the wake with ticket will not come to the gate (it failed, or was
// dropped, before its start). It is harmless after enter.
func (g *startGate) end(ticket uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dropAheadLocked(ticket) {
		g.dispatchLocked()
	}
}

func (g *startGate) dropAheadLocked(ticket uint64) bool {
	i, ok := slices.BinarySearchFunc(g.ahead, ticket, func(a gateAhead, t uint64) int { return cmp.Compare(a.ticket, t) })
	if ok {
		g.ahead = slices.Delete(g.ahead, i, i+1)
	}
	return ok
}

// enter waits for a slot, behind every waiter with a lower ticket, and behind every wake
// with a lower ticket not at the gate yet for at most hold from its begin. The returned
// release gives the slot back (idempotent); on a ctx error no slot is held.
func (g *startGate) enter(ctx context.Context, ticket uint64) (release func(), err error) {
	w := &gateWaiter{ticket: ticket, admit: make(chan struct{})}
	g.mu.Lock()
	g.dropAheadLocked(ticket)
	i, _ := slices.BinarySearchFunc(g.waiting, ticket, func(w *gateWaiter, t uint64) int { return cmp.Compare(w.ticket, t) })
	g.waiting = slices.Insert(g.waiting, i, w)
	g.dispatchLocked()
	g.mu.Unlock()
	select {
	case <-w.admit:
		return sync.OnceFunc(g.leave), nil
	case <-ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.waiting, w); i >= 0 {
			g.waiting = slices.Delete(g.waiting, i, i+1)
			g.dispatchLocked()
			g.mu.Unlock()
			return nil, ctx.Err()
		}
		g.mu.Unlock()
		g.leave() // admitted meanwhile: pass the slot on
		return nil, ctx.Err()
	}
}

// leave frees a slot and hands it on.
func (g *startGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy--
	g.dispatchLocked()
}

// dispatchLocked admits the lowest waiting tickets into the free slots, unless a lower
// ticket is still before the gate and its hold has not run out: then a timer dispatches
// again when it does.
func (g *startGate) dispatchLocked() {
	hold := g.hold
	if hold == 0 {
		hold = defaultStartHold
	}
	now := g.now()
	for g.busy < g.n && len(g.waiting) > 0 {
		w := g.waiting[0]
		// The lowest wake before the gate whose hold is left: the ones below it have
		// used theirs, and the ones above it began after it.
		for _, a := range g.ahead {
			if a.ticket > w.ticket {
				break
			}
			if wait := hold - now.Sub(a.since); wait > 0 {
				g.armLocked(wait)
				return
			}
		}
		g.waiting = slices.Delete(g.waiting, 0, 1)
		g.busy++
		close(w.admit)
	}
}

// armLocked has dispatch run again after d. One timer serves: each dispatch finds the
// hold that ends first and sets it anew.
func (g *startGate) armLocked(d time.Duration) {
	if g.timer == nil {
		g.timer = time.AfterFunc(d, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.dispatchLocked()
		})
		return
	}
	g.timer.Reset(d)
}
