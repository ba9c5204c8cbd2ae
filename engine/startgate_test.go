package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
)

// TestStartGateAdmitsInTicketOrder: with every slot taken, waiters are admitted by the
// order of their wakes (ticket), not of their arrival at the gate; a waiter whose ctx
// ends leaves the queue without taking a slot.
func TestStartGateAdmitsInTicketOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &startGate{n: 2}
		a, _ := g.enter(context.Background(), 1)
		b, _ := g.enter(context.Background(), 2)
		var mu sync.Mutex
		var admitted []uint64
		var leaves []func()
		gone, cancel := context.WithCancel(context.Background())
		for _, ticket := range []uint64{7, 4, 9, 5} {
			ctx := context.Background()
			if ticket == 9 {
				ctx = gone
			}
			go func() {
				leave, err := g.enter(ctx, ticket)
				if err != nil {
					return
				}
				mu.Lock()
				admitted = append(admitted, ticket)
				leaves = append(leaves, leave)
				mu.Unlock()
			}()
			synctest.Wait() // each arrives in this order
		}
		if len(admitted) != 0 {
			t.Fatalf("admitted %v past two busy slots", admitted)
		}
		cancel()
		synctest.Wait()
		a()
		a() // idempotent: frees one slot, not two
		synctest.Wait()
		if want := []uint64{4}; !slices.Equal(admitted, want) {
			t.Fatalf("after one slot freed: admitted %v, want %v", admitted, want)
		}
		b()
		synctest.Wait()
		for done := 0; done < 3; {
			mu.Lock()
			ls := leaves[done:]
			done = len(leaves)
			mu.Unlock()
			for _, l := range ls {
				l()
			}
			synctest.Wait()
		}
		if want := []uint64{4, 5, 7}; !slices.Equal(admitted, want) {
			t.Fatalf("admitted %v, want %v (ticket order, 9 gone)", admitted, want)
		}
		if g.busy != 0 || len(g.waiting) != 0 {
			t.Fatalf("all released: busy %d, waiting %d", g.busy, len(g.waiting))
		}
	})
}
