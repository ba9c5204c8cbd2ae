package engine

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/spacestore"
)

// TestInstanceStartsWhileTheFenceIsInFlight: the wake's instance runs while its fence is
// written (the start does not wait for the fence), and when that fence finds a
// newer manifest (another writer's late write landed first) the instance is ended, the
// newer state restored and a new instance started on it before anything is proxied. A
// checkpoint kind: a kind whose durability is bucket starts its instance only once the
// fence is written and the log sealed after it.
func TestInstanceStartsWhileTheFenceIsInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t, checkpointKinds)
	ctx := context.Background()
	sp := Space{Host: "overlap.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/saved")
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}

	var fences atomic.Int32
	var firstPID atomic.Int64
	running := make(chan bool, 4)
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if op != membucket.OpPut || !strings.HasSuffix(key, "/manifest") || stateOf(e.lookup(sp.Host)) != StateWaking {
			return nil
		}
		// The fence write waits for the instance to run: a wake that fences before
		// it starts the instance never gets there.
		in := e.lookup(sp.Host)
		var p *proc
		for deadline := time.Now().Add(20 * time.Second); p == nil && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			in.mu.Lock()
			p = in.proc
			in.mu.Unlock()
		}
		running <- p != nil && !p.done()
		if fences.Add(1) == 1 {
			if p != nil {
				firstPID.Store(int64(p.pid))
			}
			// An earlier holder's late write: the manifest changes under the fence.
			dir := t.TempDir()
			late := &spacestore.Syncer{Bucket: c.Bucket, Host: sp.Host, DataDir: filepath.Join(dir, "d"), WorkDir: filepath.Join(dir, "w")}
			if err := late.Load(ctx); err != nil {
				t.Error(err)
			} else if err := late.Fence(ctx, spacestore.Claim{Holder: "late", Incarnation: "0", Lease: "x", At: time.Now()}); err != nil {
				t.Error(err)
			}
		}
		return nil
	})
	u, err = e.Acquire(ctx, sp)
	c.SetFail(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	if n := fences.Load(); n != 2 {
		t.Errorf("%d fences, want 2 (the first lost to the late write)", n)
	}
	for range len(running) {
		if !<-running {
			t.Fatal("the fence was written before the instance started")
		}
	}
	if first := int(firstPID.Load()); u.pid == first || !procGone(first) {
		t.Fatalf("the instance that ran under the lost fence (%d) is still there, or serves (%d)", first, u.pid)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); got != "/saved\n" {
		t.Fatalf("bucket holds %q", got)
	}
}
