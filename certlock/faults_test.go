package certlock

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// newMemBucket is the shared in-memory bucket with S3's whole-second timestamps, its
// clock the time package's (so synctest drives the lock protocol), behind a wrapper that
// injects the faults the lock tests need.
func newMemBucket() *membucket.Counting {
	mem := membucket.New()
	mem.Granularity = time.Second
	return membucket.NewCounting(mem)
}

var errStalled = errors.New("bucket unreachable")

// setStalled fails every request while on, as a cut network does.
func setStalled(b *membucket.Counting, on bool) {
	if !on {
		b.SetFail(nil)
		return
	}
	b.SetFail(func(context.Context, membucket.Op, string) error { return errStalled })
}

// loseReplies makes the next n puts apply but answer with an error, as when a
// connection breaks after the store took the write.
func loseReplies(b *membucket.Counting, n int64) {
	var left atomic.Int64
	left.Store(n)
	b.SetAfter(func(_ context.Context, op membucket.Op, key string, err error) error {
		if err == nil && op == membucket.OpPut && left.Add(-1) >= 0 {
			return errors.New("put " + key + ": connection reset")
		}
		return err
	})
}

// hangPuts makes the next n puts hang until their context ends.
func hangPuts(b *membucket.Counting, n int64) {
	var left atomic.Int64
	left.Store(n)
	b.SetFail(func(ctx context.Context, op membucket.Op, _ string) error {
		if op == membucket.OpPut && left.Add(-1) >= 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
}
