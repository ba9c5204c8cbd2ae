package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/engine"
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
	// A space in use is never the victim: hold a and c, wake b over the cap.
	ua, uc := acquire(t, e, a), acquire(t, e, c)
	defer ua.Release()
	defer uc.Release()
	acquire(t, e, b).Release()
	for _, h := range []string{"a.test", "b.test", "c.test"} {
		if st := status(e, h).State; st != engine.StateAwake {
			t.Fatalf("%s is %s while in use, want awake", h, st)
		}
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
	eventually(t, "idle sleep although an earlier period's Use is still open", func() bool {
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
