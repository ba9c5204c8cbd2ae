package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/tests/harness"
)

func TestMaxAwakeSleepsLeastRecentlyUsed(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", func(c *engine.Config) { c.MaxAwake = 2 })
	a, b, c := engine.Space{Host: "a.test", Kind: "app"}, engine.Space{Host: "b.test", Kind: "app"}, engine.Space{Host: "c.test", Kind: "app"}
	acquire(t, e, a).Release()
	time.Sleep(10 * time.Millisecond) // distinct last-use times
	ub := acquire(t, e, b)
	ub.Release()
	time.Sleep(10 * time.Millisecond)
	acquire(t, e, a).Release() // a is now more recent than b
	acquire(t, e, c).Release()
	if st := status(e, "b.test").State; st != engine.StateAsleep {
		t.Fatalf("b (least recently used) is %s, want asleep", st)
	}
	for _, h := range []string{"a.test", "c.test"} {
		if st := status(e, h).State; st != engine.StateAwake {
			t.Fatalf("%s is %s, want awake", h, st)
		}
	}
	// A space in use (a request or an open stream holding its Use) is never the victim,
	// and the cap holds: with a and c held, the wake of b is refused with a Retry-After,
	// without touching the bucket; once c is released and idle, b wakes in its place.
	ua, uc := acquire(t, e, a), acquire(t, e, c)
	defer ua.Release()
	_, err := e.Acquire(context.Background(), b)
	var re *engine.RetryError
	if !errors.As(err, &re) || re.After <= 0 {
		t.Fatalf("wake over the cap with every awake space in use = %v, want a RetryError with Retry-After", err)
	}
	for h, want := range map[string]engine.State{"a.test": engine.StateAwake, "b.test": engine.StateAsleep, "c.test": engine.StateAwake} {
		if st := status(e, h).State; st != want {
			t.Fatalf("%s is %s after a refused wake over the cap, want %s", h, st, want)
		}
	}
	if n := e.Counters().CapRefusals; n != 1 {
		t.Fatalf("cap_refusals = %d, want 1", n)
	}
	uc.Release()
	acquire(t, e, b).Release()
	for h, want := range map[string]engine.State{"a.test": engine.StateAwake, "b.test": engine.StateAwake, "c.test": engine.StateAsleep} {
		if st := status(e, h).State; st != want {
			t.Fatalf("%s is %s after c went idle, want %s", h, st, want)
		}
	}
}

// TestMaxAwakeHoldsUnderConcurrentWakes: many spaces woken at once never put more than
// MaxAwake of them awake, whatever the interleaving.
func TestMaxAwakeHoldsUnderConcurrentWakes(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", func(c *engine.Config) { c.MaxAwake = 2 })
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []*engine.Use
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := e.Acquire(context.Background(), engine.Space{Host: fmt.Sprintf("s%d.test", i), Kind: "app"})
			if err == nil {
				mu.Lock()
				held = append(held, u) // held like an open stream: never released here
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	awake := 0
	for _, st := range e.Status() {
		if st.State == engine.StateAwake || st.State == engine.StateWaking {
			awake++
		}
	}
	if awake > 2 || len(held) > 2 {
		t.Fatalf("%d spaces awake, %d uses granted under max_awake 2", awake, len(held))
	}
	if len(held) == 0 {
		t.Fatal("no wake succeeded")
	}
	for _, u := range held {
		u.Release()
	}
}

// A Use from before a forced sleep must not count against the next awake period.
func TestStaleUseDoesNotPinNextWake(t *testing.T) {
	f := newFixture(t)
	f.kind.IdleTimeout = 200 * time.Millisecond
	e := f.engine("1", nil)
	sp := engine.Space{Host: "stale.test", Kind: "app"}
	old := acquire(t, e, sp)
	if err := e.Sleep(context.Background(), sp.Host); err != nil {
		t.Fatal(err)
	}
	u := acquire(t, e, sp)
	u.Release()
	harness.WaitFor(t, settle, "idle sleep although an earlier period's Use is still open", func() bool {
		return status(e, "stale.test").State == engine.StateAsleep
	})
	old.Release() // a late release must not make the count negative
	u = acquire(t, e, sp)
	defer u.Release()
	time.Sleep(time.Second) // several idle timeouts
	if st := status(e, "stale.test").State; st != engine.StateAwake {
		t.Fatalf("space is %s while a Use is held", st)
	}
}
