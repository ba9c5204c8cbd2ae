package box_test

import (
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/lifecycle"
)

// TestHealthTurnsAtTheDrain: a balancer's check passes while the box serves and fails
// from the drain's first step, and after the close.
func TestHealthTurnsAtTheDrain(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{})
	for _, step := range []struct {
		name string
		do   func()
		want lifecycle.State
		ok   bool
	}{
		{"open", func() {}, lifecycle.Serving, true},
		{"drain", func() { b.Drain() }, lifecycle.Draining, false},
		{"close", func() { b.Close() }, lifecycle.Closed, false},
	} {
		step.do()
		if s, ok := b.Health(); s != step.want || ok != step.ok {
			t.Errorf("after %s: Health() = %s, %v; want %s, %v", step.name, s, ok, step.want, step.ok)
		}
	}
}
