package engine

import (
	"context"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// TestUnfenceAdoptsItsOwnUnsureCheckpoint: a box is fenced (its heartbeat writes late)
// while a checkpoint of a space on checkpoint durability is in flight, and the checkpoint's
// manifest write lands with its answer lost. At the unfence the lease is still the box's,
// so the manifest in the bucket is its own: the recheck adopts it and checkpoints the data
// dir, which holds every write acknowledged since, rather than drop the local state as if
// another box had taken the space over. Found by a 10-minute campaign (stop 49): a box
// fenced for a moment under load lost a write it had answered 1 s before.
func TestUnfenceAdoptsItsOwnUnsureCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	const host = "unfence.example.com"
	f := newStandbyFleet(t, "box-a")
	a := f.engines["box-a"]
	sp := wakeKind(t, a, host, "ckpt")
	sp.acknowledged(createM, insertM("before the checkpoint"))
	in := a.get(host)
	f.buckets["box-a"].loseManifestAnswer.Store(true)
	a.syncNow(context.Background(), in)
	if !in.syncer.Unsure() {
		t.Fatal("the checkpoint whose answer was lost left its manifest write settled")
	}
	sp.acknowledged(insertM("after the checkpoint"))
	sp.u.Release()

	a.SetFenced(true)
	testwait.WaitFor(t, 10*time.Second, "the fenced box holding the space, stopped", func() bool { return stateOf(in) == StateHeld })
	a.SetFenced(false)
	testwait.WaitFor(t, 10*time.Second, "the recheck", func() bool {
		st := stateOf(in)
		return st != StateHeld && st != StateRechecking
	})
	if st := stateOf(in); st != StateAsleep {
		t.Errorf("after the recheck the space is %s, want asleep (checkpointed, the lease released)", st)
	}
	if n := rowsOfKind(t, a, host, "ckpt"); n != 2 {
		t.Fatalf("the space has %d of the 2 acknowledged rows after the unfence", n)
	}
}
