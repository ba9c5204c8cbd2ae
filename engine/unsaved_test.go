package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/lchat/lchat-caddy/spacestore"
)

// TestFailedWakeKeepsUnsavedState: a space whose final checkpoint failed is unsaved (its
// local state newer than the bucket, its lease kept). A wake from there that fails after
// keeping the local state (here its fence write fails) leaves it unsaved, lease and all, so
// the next wake keeps the local state again and the write survives. Before, the wake
// cleared the unsaved mark before it could fail and gave the lease back: the next wake
// restored the older bucket state over the acknowledged write.
func TestFailedWakeKeepsUnsavedState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t)
	ctx := context.Background()
	sp := Space{Host: "unsaved.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/saved")
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	if u, err = e.Acquire(ctx, sp); err != nil {
		t.Fatal(err)
	}
	post(t, u, "/acknowledged-then-unsaved")
	u.Release()
	refuse := refuseManifests(c)
	if err := e.Sleep(ctx, sp.Host); err == nil {
		t.Fatal("sleep with a failing checkpoint reported success")
	}
	if st := stateOf(e.lookup(sp.Host)); st != StateUnsaved {
		t.Fatalf("after a failed final checkpoint: %s, want unsaved", st)
	}
	// The wake keeps the local state, then its fence (a manifest write) fails.
	var re *RetryError
	if _, err := e.Acquire(ctx, sp); !errors.As(err, &re) {
		t.Fatalf("wake whose fence fails = %v, want a RetryError", err)
	}
	if st := stateOf(e.lookup(sp.Host)); st != StateUnsaved {
		t.Fatalf("after a failed wake from unsaved: %s, want unsaved", st)
	}
	if l, _, _ := spacestore.ReadLease(ctx, c.Bucket, sp.Host); l.Released {
		t.Fatal("the failed wake gave the lease of an unsaved space back")
	}
	refuse.Store(false)
	in := e.lookup(sp.Host)
	in.mu.Lock()
	in.retry = retryHold{} // skip the backoff
	in.mu.Unlock()
	if u, err = e.Acquire(ctx, sp); err != nil {
		t.Fatal(err)
	}
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); got != "/saved\n/acknowledged-then-unsaved\n" {
		t.Fatalf("bucket holds %q, want both acknowledged writes", got)
	}
}
