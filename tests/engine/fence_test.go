package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

func TestHeartbeatFenceStopsWritesAndRechecksLease(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", nil)
	ctx := context.Background()
	mine := engine.Space{Host: "mine.test", Kind: "app"}
	lost := engine.Space{Host: "lost.test", Kind: "app"}
	for _, sp := range []engine.Space{mine, lost} {
		u := acquire(t, e, sp)
		call(t, u, "POST", "/msg?body=while-fenced-"+sp.Host)
		u.Release()
	}
	pid := status(e, "mine.test").PID
	_, etagBefore, _ := spacestore.ReadManifest(ctx, f.bucket, "mine.test")

	e.SetFenced(true)
	harness.WaitFor(t, settle, "instances stopped by fence", func() bool {
		return status(e, "mine.test").State == engine.StateHeld && status(e, "lost.test").State == engine.StateHeld
	})
	if alive(pid) {
		t.Fatal("instance still running while fenced")
	}
	var re *engine.RetryError
	if _, err := e.Acquire(ctx, mine); !errors.As(err, &re) {
		t.Fatalf("acquire while fenced = %v, want RetryError", err)
	}
	if _, etag, _ := spacestore.ReadManifest(ctx, f.bucket, "mine.test"); etag != etagBefore {
		t.Fatal("a fenced box wrote a manifest")
	}
	if l := readLease(t, f.bucket, "mine.test"); l.Released {
		t.Fatal("a fenced box released (wrote) a lease")
	}

	// Meanwhile another box takes lost.test over (our heartbeat looked dead to it).
	other := spacestore.Holder{ID: "https://box-b.test", Incarnation: "1"}
	if _, err := spacestore.AcquireLease(ctx, f.bucket, "lost.test", other, time.Now()); err != nil {
		t.Fatal(err)
	}
	foreign := &spacestore.Manifest{Generation: 50, WrittenBy: other.ID}
	_, etag, _ := spacestore.ReadManifest(ctx, f.bucket, "lost.test")
	if _, err := spacestore.WriteManifest(ctx, f.bucket, "lost.test", foreign, etag); err != nil {
		t.Fatal(err)
	}

	e.SetFenced(false)
	harness.WaitFor(t, settle, "lease re-read after unfence", func() bool {
		return status(e, "mine.test").State == engine.StateAsleep && status(e, "lost.test").State == engine.StateAsleep
	})
	if l := readLease(t, f.bucket, "mine.test"); !l.Released {
		t.Fatalf("mine.test lease after unfence = %+v, want released after its checkpoint", l)
	}
	if m, _, _ := spacestore.ReadManifest(ctx, f.bucket, "lost.test"); m.WrittenBy != other.ID {
		t.Fatalf("lost.test manifest overwritten after unfence: %+v", m)
	}
	if l := readLease(t, f.bucket, "lost.test"); l.Holder != other.ID || l.Released {
		t.Fatalf("lost.test lease after unfence = %+v, want box-b's", l)
	}
	u := acquire(t, e, mine)
	defer u.Release()
	if _, got := call(t, u, "GET", "/msgs"); got != "while-fenced-mine.test" {
		t.Fatalf("mine.test after unfence: %q", got)
	}
}

// TestFenceStopIsBoundedByFenceStopGrace: a heartbeat fence must have the instances gone
// before peers count this box dead, whatever the kind's stop_grace: an instance that
// ignores SIGTERM under a one-minute grace is killed within FenceStopGrace.
func TestFenceStopIsBoundedByFenceStopGrace(t *testing.T) {
	f := newFixture(t)
	f.kind.StopGrace = time.Minute
	e := f.engine("1", func(c *engine.Config) { c.FenceStopGrace = 300 * time.Millisecond })
	sp := engine.Space{Host: "stubborn.test", Kind: "app", Env: map[string]string{"IGNORE_TERM": "1"}}
	u := acquire(t, e, sp)
	u.Release()
	pid := status(e, "stubborn.test").PID

	start := time.Now()
	e.SetFenced(true)
	harness.WaitFor(t, settle, "stubborn instance stopped by fence", func() bool { return !alive(pid) })
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("fence stop took %v; the kind's one-minute grace was not capped", took)
	}
}
