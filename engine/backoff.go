package engine

import (
	"errors"
	"time"

	"go.uber.org/zap"
)

// Failed wakes back off per space. A wake that fails on the bucket (an outage, a corrupt
// blob) or on the instance costs a lease write and release and possibly a full restore; if
// every request started another one, any client could run up the bucket's egress and a
// store outage would be amplified by the request rate. After a failed wake the space
// refuses new wakes for wakeBackoff(n) (503 with the remaining time in Retry-After), and
// a refused wake does nothing at all: no bucket request, no other space put to sleep to
// make room for it. A successful wake resets the count.

// wakeBackoffBase and wakeBackoffMax bound the wait after consecutive failed wakes:
// base, 2*base, 4*base ... capped at max.
const (
	wakeBackoffBase = time.Second
	wakeBackoffMax  = 2 * time.Minute
)

// wakeBackoff is the wait after n consecutive failed wakes (n >= 1).
func wakeBackoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := wakeBackoffBase << min(n-1, 20)
	return min(d, wakeBackoffMax)
}

// noteWakeResultLocked records the outcome of a wake with in.mu held: a failure that was
// ours to retry (a RetryError other than the awake cap) starts or extends the space's
// backoff, a success resets it.
func (in *inst) noteWakeResultLocked(err error) {
	if err == nil {
		in.wakeFails = 0
		return
	}
	var re *RetryError
	if !errors.As(err, &re) || errors.Is(err, errAwakeCap) || in.e.ctx.Err() != nil || in.e.draining.Load() {
		return
	}
	in.wakeFails++
	in.e.c.wakeFailures.Add(1)
	b := wakeBackoff(in.wakeFails)
	if at := in.e.now().Add(b); at.After(in.retryAt) {
		in.retryAt = at
		in.retryWhy = re.Reason
	}
	re.After = ceilSecond(in.retryAt.Sub(in.e.now())) // the remaining backoff, for Retry-After
	in.logger().Warn("wake failed; backing off", zap.String("reason", re.Reason),
		zap.Int("consecutive_failures", in.wakeFails), zap.Duration("retry_in", re.After))
}

// ceilSecond rounds a remaining wait up to whole seconds, Retry-After's unit, so a client
// that waits what it was told never arrives early.
func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}
