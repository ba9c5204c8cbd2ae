// Package backoff holds the one backoff type of lchat-caddy. Every retry loop waits by a
// Curve, and each thing that backs off has its own, a named variable declared beside its
// package's other constants with a doc comment that says what backs off and the values:
// a curve is changed there, never beside its loop.
package backoff

import "time"

// Curve is a capped doubling curve: how long a retry waits after failures.
type Curve struct {
	// First is the wait after the first failure that waits.
	First time.Duration
	// Max caps the wait.
	Max time.Duration
	// Free is how many consecutive failures wait nothing before the curve starts.
	Free int
}

// After is the wait after n consecutive failures: nothing for the first Free of them,
// then First, doubling with each failure, capped at Max.
func (c Curve) After(n int) time.Duration {
	if n <= c.Free {
		return 0
	}
	d := c.First
	for i := c.Free + 1; i < n && d < c.Max; i++ {
		d *= 2
	}
	return min(d, c.Max)
}

// Next is the wait that follows a wait of d on the same curve: First after none (d <= 0),
// else twice d, capped at Max. A loop that raises its wait to a hint (a Retry-After)
// steps on from there.
func (c Curve) Next(d time.Duration) time.Duration {
	if d <= 0 {
		return min(c.First, c.Max)
	}
	return min(2*d, c.Max)
}
