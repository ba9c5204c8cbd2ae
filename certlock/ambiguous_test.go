package certlock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestCreateWithLostReplyIsRecognized: a lock create the store applied but answered
// with an error is this Locker's own lock on the retry, held at once; before, the retry
// read it as another holder's and waited a whole TTL for it to go stale.
func TestCreateWithLostReplyIsRecognized(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBucket()
		a, c := newLocker(b, "a"), newLocker(b, "c")
		ctx := context.Background()
		loseReplies(b, 1)
		if ok, err := a.TryLock(ctx, "n"); ok || err == nil {
			t.Fatalf("create with a lost reply = %v, %v; want an error", ok, err)
		}
		b.SetAfter(nil)
		start := time.Now()
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited >= testTTL {
			t.Fatalf("the retry waited %v for its own lock, want it held at once", waited)
		}
		if ok, err := c.TryLock(ctx, "n"); ok || err != nil {
			t.Fatalf("another locker got the lock (%v, %v)", ok, err)
		}
		if err := a.Unlock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
	})
}
