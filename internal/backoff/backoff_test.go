package backoff

import (
	"testing"
	"time"
)

// TestCurve: a table of failures counted to the wait that follows them, for curves with
// and without free failures, and a loop that keeps its last wait (Next) steps along the
// same curve as one that counts its failures (After).
func TestCurve(t *testing.T) {
	for _, tc := range []struct {
		name  string
		curve Curve
		waits map[int]time.Duration // consecutive failures: the wait after them
	}{
		{"doubling to a cap", Curve{First: time.Second, Max: 2 * time.Minute}, map[int]time.Duration{
			-1: 0, 0: 0, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 7: 64 * time.Second,
			8: 2 * time.Minute, 64: 2 * time.Minute, 1 << 20: 2 * time.Minute}},
		// The first failure waits nothing; the curve starts at the second.
		{"one free failure", Curve{First: time.Second, Max: time.Minute, Free: 1}, map[int]time.Duration{
			0: 0, 1: 0, 2: time.Second, 3: 2 * time.Second, 4: 4 * time.Second, 7: 32 * time.Second,
			8: time.Minute, 50: time.Minute}},
		{"cap not a doubling of first", Curve{First: 2 * time.Millisecond, Max: 50 * time.Millisecond}, map[int]time.Duration{
			1: 2 * time.Millisecond, 5: 32 * time.Millisecond, 6: 50 * time.Millisecond, 7: 50 * time.Millisecond}},
		{"first above the cap", Curve{First: time.Second, Max: 100 * time.Millisecond}, map[int]time.Duration{
			0: 0, 1: 100 * time.Millisecond, 5: 100 * time.Millisecond}},
		{"zero", Curve{}, map[int]time.Duration{0: 0, 1: 0, 10: 0}},
	} {
		for n, want := range tc.waits {
			if got := tc.curve.After(n); got != want {
				t.Errorf("%s: after %d failures %v, want %v", tc.name, n, got, want)
			}
		}
		var d time.Duration
		for n := tc.curve.Free + 1; n < tc.curve.Free+40; n++ {
			d = tc.curve.Next(d)
			if want := tc.curve.After(n); d != want {
				t.Fatalf("%s: wait %d by Next %v, by After %v", tc.name, n-tc.curve.Free, d, want)
			}
		}
	}
}

// TestNextFromHint: a loop that raised its wait to a hint steps on from the hint, doubling,
// capped.
func TestNextFromHint(t *testing.T) {
	c := Curve{First: time.Second, Max: 5 * time.Minute}
	for _, tc := range []struct{ d, want time.Duration }{
		{-time.Second, time.Second},
		{0, time.Second},
		{7 * time.Second, 14 * time.Second},
		{3 * time.Minute, 5 * time.Minute},
		{time.Hour, 5 * time.Minute},
	} {
		if got := c.Next(tc.d); got != tc.want {
			t.Errorf("Next(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}
