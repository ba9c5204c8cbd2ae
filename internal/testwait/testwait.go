// Package testwait is the one polling wait of the tests: the multi-process tests under
// tests/ (through tests/harness) and the in-package tests that wait on another goroutine's
// outcome they have no channel for.
package testwait

import (
	"fmt"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
)

// waitCurve is how often WaitFor asks its condition: at once, then 1 ms later, doubling
// to every 50 ms. A condition that holds soon (an in-process state) is seen within a
// millisecond or two; one that takes seconds (a box's timers, a sync, a membership beat)
// costs the box one question per 50 ms, and a duration WaitFor returns is within 50 ms.
var waitCurve = backoff.Curve{First: time.Millisecond, Max: 50 * time.Millisecond}

// WaitFor waits until cond holds and returns how long that took. It is the one polling
// wait of the tests: a box's timers (idle, sync, heartbeat, scheduled wakes)
// run in another process, so there is no clock to drive, and a test waits on the outcome
// it relies on, never on a guess of how long that takes. A caller that has a channel for
// the outcome waits on the channel instead. cond is asked at once, then on waitCurve, and once more at the deadline. If it
// still does not hold after timeout, WaitFor fails the test with Fatalf ("timed out
// after 10s waiting for <what>"), followed by the answer of each diag (the last status
// seen, say), so a failure names its cause. Like Fatalf, call it from the test's own
// goroutine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool, diag ...func() string) time.Duration {
	t.Helper()
	start := time.Now()
	if Poll(timeout, cond) {
		return time.Since(start)
	}
	msg := fmt.Sprintf("timed out after %v waiting for %s", timeout, what)
	for _, d := range diag {
		msg += "; " + d()
	}
	t.Fatal(msg)
	return time.Since(start)
}

// Poll asks cond on waitCurve until it holds (true) or timeout has passed (false), with
// one last question at the deadline. It asks at least once, whatever the timeout.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	var wait time.Duration
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		wait = waitCurve.Next(wait)
		time.Sleep(min(wait, left))
	}
	return true
}
