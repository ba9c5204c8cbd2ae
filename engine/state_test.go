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

// putLocked puts the space in s without the transition table: a test's starting point,
// with the transition a wake or stop in flight has.
func (in *inst) putLocked(s State) {
	in.state = s
	in.here.Store(s == StateAwake || s == StateWaking)
	in.trans = nil
	if s.transitional() {
		in.trans = &transition{done: make(chan struct{})}
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

var allStates = []State{StateAsleep, StateWaking, StateAwake, StateSleeping, StateFailed, StateFenced,
	StateHeld, StateRechecking, StateUnsaved, StateDropped}

// TestTransitions: every allowed transition is taken, every other one is refused and leaves
// the state as it was. The table is the lifecycle: a wake starts only from a state with no
// process and nothing unsaved to re-check; only an awake space stops, always through
// sleeping; a dropped space never moves again. The machine's other fields move with it: a
// wake or stop in flight (in.trans) exists exactly while waking or sleeping, and its
// waiters are let go by the move out; a drain lasts as long as the process.
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
			in.draining = in.drainLocked()
			before := in.trans
			err := in.setStateLocked(to)
			got, trans, draining := in.state, in.trans, in.draining
			here := in.here.Load()
			in.mu.Unlock()
			if allowed[[2]State{from, to}] {
				if err != nil || got != to || here != (to == StateAwake || to == StateWaking) {
					t.Errorf("%s -> %s: err %v, state %s, here %v; want it taken", from, to, err, got, here)
				}
				if (trans != nil) != to.transitional() || trans != nil && (trans == before || trans.from != from || closed(trans.done)) {
					t.Errorf("%s -> %s: transition %+v; want a new one open exactly in waking and sleeping", from, to, trans)
				}
				if before != nil && !closed(before.done) {
					t.Errorf("%s -> %s: the waiters of the %s transition were not let go", from, to, from)
				}
				if want := from.runs() && to.runs(); draining != want {
					t.Errorf("%s -> %s: draining %v, want %v (a drain lasts while the process does)", from, to, draining, want)
				}
				continue
			}
			askedRefusals.Add(1)
			var te errTransition
			if !errors.As(err, &te) || got != from || trans != before || before != nil && closed(before.done) {
				t.Errorf("%s -> %s: err %v, state %s; want it refused, the state and its transition kept", from, to, err, got)
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

// TestStopOutcome: every stop ends where its cause says, whatever the checkpoint left and
// whether this box still holds the lease, and always by a move the table allows from
// sleeping: a saved stop ends where its checkpoint leaves it; a heartbeat fence keeps the
// lease and local state (held) or, holding no lease, has nothing to keep (asleep); a
// fence-out ends fenced; a discard ends asleep for the drop that follows.
func TestStopOutcome(t *testing.T) {
	for _, tc := range []struct {
		outcome   stopOutcome
		saved     State // what the checkpoint left (a save only)
		leaseHeld bool
		want      State
	}{
		{stopSave, StateAsleep, false, StateAsleep},
		{stopSave, StateUnsaved, true, StateUnsaved},
		{stopSave, StateFenced, false, StateFenced},
		{stopSave, StateHeld, true, StateHeld},
		{stopKeep, "", true, StateHeld},
		{stopKeep, "", false, StateAsleep},
		{stopFencedOut, "", false, StateFenced},
		{stopFencedOut, "", true, StateFenced},
		{stopDiscard, "", true, StateAsleep},
		{stopDiscard, "", false, StateAsleep},
	} {
		got := tc.outcome.next(tc.saved, tc.leaseHeld)
		if got != tc.want {
			t.Errorf("outcome %d (checkpoint left %q, lease held %v): %s, want %s", tc.outcome, tc.saved, tc.leaseHeld, got, tc.want)
		}
		if !canMove(StateSleeping, got) {
			t.Errorf("outcome %d (checkpoint left %q, lease held %v): %s, which the table refuses from sleeping", tc.outcome, tc.saved, tc.leaseHeld, got)
		}
	}
}
