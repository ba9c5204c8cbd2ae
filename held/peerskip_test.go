package held

import (
	"slices"
	"testing"
	"time"
)

// TestPeerSkips: a peer whose part failed is left out of the calls that follow; once its
// backoff passes one call probes it (one probe at a time, the peer still left out); a probe
// that fails doubles the backoff, one that gets an answer brings the peer back.
func TestPeerSkips(t *testing.T) {
	var s peerSkips
	now := time.Unix(1e9, 0)
	peers := []string{"a", "b", "c"}
	plan := func(wantCall, wantProbe []string) {
		t.Helper()
		call, probe := s.plan(peers, now)
		if !slices.Equal(call, wantCall) || !slices.Equal(probe, wantProbe) {
			t.Fatalf("at +%v: call %v, probe %v; want call %v, probe %v", now.Sub(time.Unix(1e9, 0)), call, probe, wantCall, wantProbe)
		}
	}
	plan([]string{"a", "b", "c"}, nil)
	if !s.failed("b", now) {
		t.Fatal("b's first failure not reported as it going down")
	}
	plan([]string{"a", "c"}, nil)
	now = now.Add(999 * time.Millisecond)
	plan([]string{"a", "c"}, nil)
	now = now.Add(time.Millisecond) // the first backoff (1 s) passed: one probe
	plan([]string{"a", "c"}, []string{"b"})
	plan([]string{"a", "c"}, nil) // the probe is out: no second one
	if s.failed("b", now) {
		t.Fatal("a failed probe reported as the peer going down again")
	}
	now = now.Add(time.Second) // the backoff doubled: 2 s
	plan([]string{"a", "c"}, nil)
	now = now.Add(time.Second)
	plan([]string{"a", "c"}, []string{"b"})
	if !s.answered("b") {
		t.Fatal("the answered probe did not report b down until then")
	}
	plan([]string{"a", "b", "c"}, nil)
	if s.answered("b") {
		t.Fatal("an answer from a peer that was up reported as it coming back")
	}
	// Down again: the curve starts over at 1 s.
	s.failed("b", now)
	now = now.Add(time.Second)
	plan([]string{"a", "c"}, []string{"b"})
}
