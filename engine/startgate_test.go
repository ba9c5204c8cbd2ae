package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestStartGateAdmitsInTicketOrder: with every slot taken, waiters are admitted by the
// order of their wakes (ticket), not of their arrival at the gate; a waiter whose ctx
// ends leaves the queue without taking a slot.
func TestStartGateAdmitsInTicketOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &startGate{n: 2, now: time.Now}
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

// TestStartGateKeepsASlotForALowerTicketBeforeIt: a wake with a lower ticket that is still
// before the gate (restoring) gets the free slot before a higher one already waiting, for
// at most the hold from its begin; a wake that ends before the gate gives its claim up at
// once.
func TestStartGateKeepsASlotForALowerTicketBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const hold = 50 * time.Millisecond
		g := &startGate{n: 1, hold: hold, now: time.Now}
		var mu sync.Mutex
		var admitted []uint64
		enter := func(ticket uint64) {
			go func() {
				leave, err := g.enter(context.Background(), ticket)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				admitted = append(admitted, ticket)
				mu.Unlock()
				leave()
			}()
		}
		got := func() []uint64 {
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(admitted)
		}

		// 1 restores while 2 is at the gate: 2 waits for it.
		g.begin(1)
		g.begin(2)
		time.Sleep(10 * time.Millisecond)
		enter(2)
		if a := got(); len(a) != 0 {
			t.Fatalf("admitted %v while ticket 1 was before the gate within its hold", a)
		}
		time.Sleep(10 * time.Millisecond)
		enter(1)
		if a, want := got(), []uint64{1, 2}; !slices.Equal(a, want) {
			t.Fatalf("admitted %v, want %v", a, want)
		}

		// 3 never comes: 4 is admitted once 3's hold has run out, not before.
		g.begin(3)
		g.begin(4)
		enter(4)
		time.Sleep(hold - time.Millisecond)
		if a := got(); len(a) != 2 {
			t.Fatalf("admitted %v before ticket 3's hold ran out", a)
		}
		time.Sleep(time.Millisecond)
		if a, want := got(), []uint64{1, 2, 4}; !slices.Equal(a, want) {
			t.Fatalf("admitted %v after ticket 3's hold, want %v", a, want)
		}

		// 5 ends before the gate (its wake failed): 6 is admitted at once.
		g.begin(5)
		g.begin(6)
		enter(6)
		if a := got(); len(a) != 3 {
			t.Fatalf("admitted %v while ticket 5 was before the gate", a)
		}
		g.end(5)
		if a, want := got(), []uint64{1, 2, 4, 6}; !slices.Equal(a, want) {
			t.Fatalf("admitted %v after ticket 5 ended, want %v", a, want)
		}
		g.end(3)
		g.end(6) // after its enter: harmless
		if g.busy != 0 || len(g.waiting) != 0 || len(g.ahead) != 0 {
			t.Fatalf("all done: busy %d, waiting %d, ahead %d", g.busy, len(g.waiting), len(g.ahead))
		}
	})
}
