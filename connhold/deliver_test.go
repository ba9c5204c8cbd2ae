package connhold

import (
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
)

// TestRedeliveryCurve: an event the instance did not acknowledge is delivered again after
// 100ms, doubling to 5s, unless the limits set the curve's ends; the hub's defaulted
// limits wait by redeliveryBackoff itself.
func TestRedeliveryCurve(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lim   Limits
		curve backoff.Curve
		waits map[int]time.Duration // failed deliveries in a row: the wait before the next
	}{
		{"default", Limits{}, redeliveryBackoff, map[int]time.Duration{1: 100 * time.Millisecond,
			2: 200 * time.Millisecond, 6: 3200 * time.Millisecond, 7: 5 * time.Second, 9: 5 * time.Second}},
		{"first set", Limits{RetryFirst: time.Millisecond}, backoff.Curve{First: time.Millisecond, Max: 5 * time.Second},
			map[int]time.Duration{1: time.Millisecond, 4: 8 * time.Millisecond}},
		{"both set", Limits{RetryFirst: time.Second, RetryMax: 3 * time.Second}, backoff.Curve{First: time.Second, Max: 3 * time.Second},
			map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 3 * time.Second}},
	} {
		for _, lim := range []Limits{tc.lim, tc.lim.withDefaults()} {
			c := lim.redelivery()
			if c != tc.curve {
				t.Errorf("%s: curve %+v from %+v, want %+v", tc.name, c, lim, tc.curve)
			}
			for n, want := range tc.waits {
				if got := c.After(n); got != want {
					t.Errorf("%s: after %d failed deliveries %v, want %v", tc.name, n, got, want)
				}
			}
		}
	}
}
