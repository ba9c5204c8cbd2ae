package certlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

const testTTL = 10 * time.Second

func newLocker(b bucket.Bucket, owner string) *Locker {
	return &Locker{Bucket: b, Prefix: "certs/locks/", Owner: owner, TTL: testTTL, Poll: time.Second}
}

// A waiting box gets the lock only after the holder releases it, however long the
// holder keeps it: the refresher keeps it fresh past many TTLs.
func TestLockWaitsForHolderBeyondTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		if err := a.Lock(ctx, "issue_cert_*.mesh.test"); err != nil {
			t.Fatal(err)
		}
		var got atomic.Bool
		done := make(chan error)
		go func() {
			err := c.Lock(ctx, "issue_cert_*.mesh.test")
			got.Store(true)
			done <- err
		}()
		time.Sleep(5 * testTTL)
		synctest.Wait()
		if got.Load() {
			t.Fatal("second holder got the lock while the first still held it")
		}
		released := time.Now()
		if err := a.Unlock(ctx, "issue_cert_*.mesh.test"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(released); waited > time.Second {
			t.Errorf("waiter took %v after the release, want within one poll", waited)
		}
		if err := c.Unlock(ctx, "issue_cert_*.mesh.test"); err != nil {
			t.Fatal(err)
		}
		if page, err := b.List(ctx, "", ""); err != nil || len(page.Objects) != 0 {
			t.Errorf("lock objects left after release: %v (%v)", page.Objects, err)
		}
	})
}

// A holder that dies (stops refreshing without releasing) blocks the others for
// about one TTL, no less and not much more.
func TestKilledHolderLockExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // a refreshed a few times
		synctest.Wait()
		a.Close() // killed: no refresh, no release
		killed := time.Now()

		if err := c.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		waited := time.Since(killed)
		if waited < testTTL-testTTL/4 {
			t.Fatalf("lock taken over %v after the holder died, before its TTL %v", waited, testTTL)
		}
		if waited > testTTL+clockSlack+2*time.Second {
			t.Fatalf("lock taken over only %v after the holder died (TTL %v)", waited, testTTL)
		}
		if err := c.Unlock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
	})
}

// A holder cut off from the bucket past its TTL loses the lock to another box,
// notices on its next refresh, and Unlock reports ErrLost without deleting the
// new holder's lock.
func TestStalledHolderLearnsItLostTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a := newLocker(b, "a")
		ctx := context.Background()
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		setStalled(b, true)
		time.Sleep(testTTL + 2*clockSlack)
		setStalled(b, false)
		c := newLocker(b, "c")
		ok, err := c.TryLock(ctx, "n")
		if err != nil || !ok {
			t.Fatalf("TryLock on a stale lock = %v, %v; want it taken over", ok, err)
		}
		time.Sleep(testTTL) // a's refresher runs and fails its If-Match
		synctest.Wait()
		if err := a.Unlock(ctx, "n"); !errors.Is(err, ErrLost) {
			t.Fatalf("old holder's Unlock = %v, want ErrLost", err)
		}
		if _, err := b.Head(ctx, c.Key("n")); err != nil {
			t.Fatalf("new holder's lock object is gone: %v", err)
		}
		if err := c.Unlock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestTryLockAndNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		if ok, err := a.TryLock(ctx, "x"); !ok || err != nil {
			t.Fatalf("first TryLock = %v, %v", ok, err)
		}
		if ok, err := c.TryLock(ctx, "x"); ok || err != nil {
			t.Fatalf("TryLock of a held lock = %v, %v; want false, nil", ok, err)
		}
		if ok, err := c.TryLock(ctx, "y"); !ok || err != nil {
			t.Fatalf("TryLock of another name = %v, %v; want it free", ok, err)
		}
		if err := c.Unlock(ctx, "x"); err == nil {
			t.Fatal("Unlock of a lock this locker does not hold succeeded")
		}
		for _, n := range []string{"x", "y"} {
			l := a
			if n == "y" {
				l = c
			}
			if err := l.Unlock(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestLockHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		if err := a.Lock(context.Background(), "n"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := c.Lock(ctx, "n"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock with an expiring context = %v", err)
		}
		a.Close()
	})
}

// Many lockers contending for one name: never two holders at once, and every
// one of them gets its turn.
func TestMutualExclusion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		var holders, maxHolders, turns atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			l := newLocker(b, string(rune('a'+i)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 3 {
					if err := l.Lock(context.Background(), "n"); err != nil {
						t.Error(err)
						return
					}
					if h := holders.Add(1); h > maxHolders.Load() {
						maxHolders.Store(h)
					}
					time.Sleep(2 * time.Second)
					holders.Add(-1)
					turns.Add(1)
					if err := l.Unlock(context.Background(), "n"); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		if maxHolders.Load() != 1 || turns.Load() != 24 {
			t.Fatalf("max simultaneous holders %d (want 1), turns %d (want 24)", maxHolders.Load(), turns.Load())
		}
	})
}

// A refresh the store applied but answered with an error (a reply lost on the
// way back) leaves the lock held: the holder recognises its own write, keeps
// refreshing, and its release deletes the lock.
func TestRefreshWithLostReplyKeepsLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		loseReplies(b, 1)
		for range 4 {
			time.Sleep(testTTL)
			synctest.Wait()
			if ok, err := c.TryLock(ctx, "n"); ok || err != nil {
				t.Fatalf("another locker got the lock (%v, %v) while its holder kept refreshing", ok, err)
			}
		}
		if err := a.Unlock(ctx, "n"); err != nil {
			t.Fatalf("Unlock after a lost refresh reply = %v, want the lock released", err)
		}
		if _, err := b.Head(ctx, a.Key("n")); err == nil {
			t.Fatal("the lock object is still there after Unlock")
		}
	})
}

// A refresh that hangs is abandoned before the next tick, so one stuck request
// does not let the lock go stale under a live holder.
func TestHungRefreshDoesNotStaleTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		hangPuts(b, 1)
		for range 3 {
			time.Sleep(testTTL)
			synctest.Wait()
			if ok, err := c.TryLock(ctx, "n"); ok || err != nil {
				t.Fatalf("another locker got the lock (%v, %v) after one refresh hung", ok, err)
			}
		}
		if err := a.Unlock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
	})
}

// Close (a config unloaded by a reload or a shutdown) stops refreshing but keeps
// the record, so certmagic's later release still deletes the lock at once
// instead of leaving other boxes waiting a TTL; new locks are refused.
func TestCloseThenUnlockReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		a.Close()
		a.Close() // idempotent
		if ok, err := a.TryLock(ctx, "m"); ok || !errors.Is(err, ErrClosed) {
			t.Fatalf("TryLock on a closed locker = %v, %v; want ErrClosed", ok, err)
		}
		if err := a.Unlock(ctx, "n"); err != nil {
			t.Fatalf("Unlock after Close = %v", err)
		}
		if ok, err := c.TryLock(ctx, "n"); !ok || err != nil {
			t.Fatalf("TryLock right after the closed holder's release = %v, %v; want the lock", ok, err)
		}
		if err := c.Unlock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
	})
}
