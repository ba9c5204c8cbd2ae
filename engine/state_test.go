package engine

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
)

// askedRefusals counts the refusals TestTransitions asks for; TestMain fails the package on
// any other.
var askedRefusals atomic.Uint64

// putLocked puts the space in s without the transition table: a test's starting point.
func (in *inst) putLocked(s State) {
	in.state = s
	in.here.Store(s == StateAwake || s == StateWaking)
}

var allStates = []State{StateAsleep, StateWaking, StateAwake, StateSleeping, StateFailed, StateFenced,
	StateHeld, StateRechecking, StateUnsaved, StateDropped}

// TestTransitions: every allowed transition is taken, every other one is refused and leaves
// the state as it was. The table is the lifecycle: a wake starts only from a state with no
// process and nothing unsaved to re-check; only an awake space stops, always through
// sleeping; a dropped space never moves again.
func TestTransitions(t *testing.T) {
	allowed := map[[2]State]bool{}
	for _, tc := range []struct {
		from State
		to   []State
	}{
		{StateAsleep, []State{StateWaking, StateDropped}},
		{StateFailed, []State{StateWaking, StateDropped}},
		{StateFenced, []State{StateWaking, StateDropped}},
		{StateUnsaved, []State{StateWaking, StateAsleep, StateFenced, StateHeld, StateDropped}},
		{StateWaking, []State{StateAwake, StateAsleep, StateFailed, StateUnsaved, StateDropped}},
		{StateAwake, []State{StateSleeping}},
		{StateSleeping, []State{StateAsleep, StateFenced, StateHeld, StateUnsaved}},
		{StateHeld, []State{StateRechecking, StateDropped}},
		{StateRechecking, []State{StateAsleep, StateHeld, StateFenced, StateUnsaved, StateDropped}},
		{StateDropped, nil},
	} {
		for _, to := range tc.to {
			allowed[[2]State{tc.from, to}] = true
		}
	}
	if len(transitions) != len(allStates) {
		t.Fatalf("transitions has %d states, want %d", len(transitions), len(allStates))
	}
	e, _ := newCountingEngine(t, Config{})
	defer e.Close()
	for _, from := range allStates {
		for _, to := range allStates {
			in := newInst(e, "t.test")
			in.mu.Lock()
			in.putLocked(from)
			err := in.setStateLocked(to)
			got := in.state
			here := in.here.Load()
			in.mu.Unlock()
			if allowed[[2]State{from, to}] {
				if err != nil || got != to || here != (to == StateAwake || to == StateWaking) {
					t.Errorf("%s -> %s: err %v, state %s, here %v; want it taken", from, to, err, got, here)
				}
				continue
			}
			askedRefusals.Add(1)
			var te errTransition
			if !errors.As(err, &te) || got != from {
				t.Errorf("%s -> %s: err %v, state %s; want it refused and the state kept", from, to, err, got)
			}
		}
	}
	for from, tos := range transitions {
		for _, to := range tos {
			if !allowed[[2]State{from, to}] {
				t.Errorf("the table allows %s -> %s, which this test does not list", from, to)
			}
		}
		if !slices.Contains(allStates, from) {
			t.Errorf("the table has state %s, which this test does not know", from)
		}
	}
}
