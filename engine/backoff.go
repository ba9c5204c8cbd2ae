package engine

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/backoff"
)

// The curves, one per thing that backs off: every retry loop of the engine waits by one
// of these (one home: a curve is changed in this block, never beside its loop).
var (
	// failedWakeBackoff: after n consecutive failed wakes of a space (inst.wakeFails)
	// its next wake waits failedWakeBackoff.After(n): 1s, 2s, 4s ... 2 min. A wake whose
	// instance started and never got ready is a failed wake, and gets this curve only:
	// it does not count as a crash (crashBackoff).
	//
	// A wake that fails on the bucket (an outage, a corrupt blob) or on the instance
	// costs a lease write and release and possibly a full restore; if every request
	// started another one, any client could run up the bucket's egress and a store
	// outage would be amplified by the request rate. So the space refuses new wakes
	// meanwhile (503 with the remaining time in Retry-After), and a refused wake does
	// nothing at all: no bucket request, no other space put to sleep to make room for it.
	// A successful wake resets the count.
	failedWakeBackoff = backoff.Curve{First: time.Second, Max: 2 * time.Minute}
	// crashBackoff: after n consecutive crashes of an awake instance (inst.crashes,
	// reset by a sleep) the next wake waits crashBackoff.After(n): the first crash wakes
	// on the next request, then 1s, 2s, 4s ... a minute.
	crashBackoff = backoff.Curve{First: time.Second, Max: time.Minute, Free: 1}
	// readyBackoff spaces the readiness probes of a starting instance (awaitReady).
	readyBackoff = backoff.Curve{First: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	// firstAnswerBackoff spaces the probes of a socket-activated instance's first
	// answer (watchFirstAnswer), off the wake's path.
	firstAnswerBackoff = backoff.Curve{First: 5 * time.Millisecond, Max: 100 * time.Millisecond}
	// wakeDeliveryBackoff spaces the attempts to deliver a due scheduled wake
	// (fireWake); a Retry-After in the answer raises the wait.
	wakeDeliveryBackoff = backoff.Curve{First: time.Second, Max: 5 * time.Minute}
	// wakeRecordBackoff spaces the retries of a scheduled-wake record write that failed
	// (retryWakeRecord); Engine.wakeRecordBackoff is this, or a test's.
	wakeRecordBackoff = backoff.Curve{First: time.Second, Max: time.Minute}
)

// noteWakeResultLocked records the outcome of a wake with in.mu held: a failure that was
// ours to retry (a RetryError other than the awake cap) starts or extends the space's
// backoff, a success resets it.
func (in *inst) noteWakeResultLocked(err error) {
	if err == nil {
		in.wakeFails = 0
		return
	}
	var re *RetryError
	if !errors.As(err, &re) || errors.Is(err, errAwakeCap) || in.e.ctx.Err() != nil || in.e.life.Draining() {
		return
	}
	in.wakeFails++
	in.e.c.wakeFailures.Add(1)
	in.retryLaterLocked(in.e.now().Add(failedWakeBackoff.After(in.wakeFails)), re.Reason)
	wait, _ := in.retryWaitLocked()
	re.After = ceilSecond(wait) // the remaining backoff, for Retry-After
	in.logger().Warn("wake failed; backing off", zap.String("reason", re.Reason),
		zap.Int("consecutive_failures", in.wakeFails), zap.Duration("retry_in", re.After))
}

// ceilSecond rounds a remaining wait up to whole seconds, Retry-After's unit, so a client
// that waits what it was told never arrives early.
func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}
