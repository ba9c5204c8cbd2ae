package derpswitch

import (
	"testing"
	"time"
)

func TestClearlyBetter(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		cur, cand time.Duration
		want      bool
	}{
		{90 * ms, 60 * ms, true},  // exactly 2/3 and 30 ms better
		{90 * ms, 61 * ms, false}, // not 2/3
		{24 * ms, 15 * ms, false}, // 2/3 but only 9 ms better
		{30 * ms, 20 * ms, true},  // 2/3 and 10 ms better
		{100 * ms, 100 * ms, false},
	} {
		if got := ClearlyBetter(tt.cur, tt.cand); got != tt.want {
			t.Errorf("ClearlyBetter(%v, %v) = %v; want %v", tt.cur, tt.cand, got, tt.want)
		}
	}
}

func TestDamper(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	cfg := AutonegConfig{StabilityWindow: 30 * time.Second, Dwell: 5 * time.Minute, MaxSwitchesPerHour: 2, BanDuration: 10 * time.Minute}
	good := map[int]time.Duration{1: 100 * ms, 2: 40 * ms, 3: 95 * ms}

	d := NewDamper(cfg)
	if got := d.Decide(t0, 1, good); got != 0 || d.Reason != "stability window" {
		t.Fatalf("first sight: %d (%s); want wait for stability", got, d.Reason)
	}
	if got := d.Decide(t0.Add(29*time.Second), 1, good); got != 0 {
		t.Fatalf("inside window: %d", got)
	}
	if got := d.Decide(t0.Add(30*time.Second), 1, good); got != 2 {
		t.Fatalf("after window: %d (%s); want 2", got, d.Reason)
	}
	// A candidate that flickers out restarts the window.
	d = NewDamper(cfg)
	d.Decide(t0, 1, good)
	d.Decide(t0.Add(10*time.Second), 1, map[int]time.Duration{1: 100 * ms, 2: 99 * ms})
	if got := d.Decide(t0.Add(35*time.Second), 1, good); got != 0 {
		t.Fatalf("window not restarted: %d", got)
	}

	// Dwell after a home change.
	d = NewDamper(cfg)
	d.NoteHomeChange(t0, true)
	d.Decide(t0, 1, good)
	if got := d.Decide(t0.Add(time.Minute), 1, good); got != 0 || d.Reason != "dwell" {
		t.Fatalf("during dwell: %d (%s)", got, d.Reason)
	}
	if got := d.Decide(t0.Add(5*time.Minute), 1, good); got != 2 {
		t.Fatalf("after dwell: %d (%s)", got, d.Reason)
	}

	// Breaker: two autonegotiated switches in the hour block a third.
	d = NewDamper(cfg)
	d.NoteHomeChange(t0, true)
	d.NoteHomeChange(t0.Add(10*time.Minute), true)
	at := t0.Add(20 * time.Minute)
	d.Decide(at, 1, good)
	if got := d.Decide(at.Add(time.Minute), 1, good); got != 0 || d.Reason != "switches per hour breaker open" {
		t.Fatalf("breaker: %d (%s)", got, d.Reason)
	}
	if got := d.Decide(t0.Add(61*time.Minute), 1, good); got != 2 {
		t.Fatalf("after the hour: %d (%s)", got, d.Reason)
	}

	// Bans exclude a region until they expire.
	d = NewDamper(cfg)
	d.Ban(t0, 2)
	d.Decide(t0, 1, good)
	if got := d.Decide(t0.Add(time.Minute), 1, good); got != 0 {
		t.Fatalf("banned region chosen: %d", got)
	}
	d.Decide(t0.Add(10*time.Minute), 1, good)
	if got := d.Decide(t0.Add(11*time.Minute), 1, good); got != 2 {
		t.Fatalf("after ban: %d (%s)", got, d.Reason)
	}
	// Unknown home latency never switches.
	if got := NewDamper(cfg).Decide(t0, 4, good); got != 0 {
		t.Fatalf("unknown home latency: %d", got)
	}
}

// TestDamperScoresByBestRecentLatency: as Tailscale's netcheck, a region is scored by its
// best latency over the history window, so a region that is momentarily slower keeps
// its place as the candidate (the stability window is not restarted by noise), until
// its good sample leaves the history.
func TestDamperScoresByBestRecentLatency(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	d := NewDamper(AutonegConfig{StabilityWindow: 30 * time.Second, Dwell: time.Minute, History: 5 * time.Minute})
	d.Decide(t0, 1, map[int]time.Duration{1: 100 * ms, 2: 40 * ms, 3: 45 * ms})
	// Region 2 is noisy now (60 ms), still clearly better than the home; 3 is steady at 45.
	noisy := map[int]time.Duration{1: 100 * ms, 2: 60 * ms, 3: 45 * ms}
	d.Decide(t0.Add(10*time.Second), 1, noisy)
	if got := d.Decide(t0.Add(30*time.Second), 1, noisy); got != 2 {
		t.Fatalf("got %d (%s); want 2, scored by its best recent 40 ms", got, d.Reason)
	}
	d = NewDamper(AutonegConfig{StabilityWindow: 30 * time.Second, Dwell: time.Minute, History: 5 * time.Minute})
	d.Decide(t0, 1, map[int]time.Duration{1: 100 * ms, 2: 40 * ms, 3: 45 * ms})
	later := t0.Add(6 * time.Minute) // the 40 ms sample has left the history
	d.Decide(later, 1, noisy)
	if got := d.Decide(later.Add(30*time.Second), 1, noisy); got != 3 {
		t.Fatalf("got %d (%s); want 3 once region 2's good sample expired", got, d.Reason)
	}
}
