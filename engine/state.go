package engine

import (
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// State is where a space is in its lifecycle on this box. Its value is what /lchat/status
// reports.
type State string

// The states of a space. A space is in exactly one; setStateLocked is the one writer and
// refuses a transition the table (transitions) does not allow.
const (
	// StateAsleep: nothing runs here, and this box holds no state the bucket lacks.
	StateAsleep State = "asleep"
	// StateWaking: a wake is in flight (lease, restore, fence, start, ready).
	StateWaking State = "waking"
	// StateAwake: the instance runs and takes requests.
	StateAwake State = "awake"
	// StateSleeping: the instance is being stopped, for whatever cause (stopSpec), and
	// its state saved when the cause says so.
	StateSleeping State = "sleeping"
	// StateFailed: the last wake failed; the next waits for its backoff (inst.retry).
	StateFailed State = "failed"
	// StateFenced: fenced out, the manifest changed behind this box (another writer owns
	// the space); this box forgot its lease and wrote nothing more.
	StateFenced State = "fenced"
	// StateHeld: stopped while this box was fenced (its heartbeat writes failing), with
	// the lease and local state newer than the bucket kept; it is re-checked (below)
	// when the box unfences or a request comes.
	StateHeld State = "held"
	// StateRechecking: a held space's lease and manifest are being re-read: still this
	// box's, its local state is saved; else dropped. One recheck at a time.
	StateRechecking State = "rechecking"
	// StateUnsaved: stopped, but its final checkpoint failed: the local state is newer
	// than the bucket and the lease is kept. The next wake here keeps the local state
	// when nobody wrote since; a drain or removal tries the checkpoint again.
	StateUnsaved State = "unsaved"
	// StateDropped: forgotten (a removal); the inst never wakes again and leaves the
	// engine's map once its local state is gone.
	StateDropped State = "dropped"
)

// transitions lists, per state, the states it may move to.
var transitions = map[State][]State{
	StateAsleep:     {StateWaking, StateDropped},
	StateFailed:     {StateWaking, StateDropped},
	StateFenced:     {StateWaking, StateDropped},
	StateUnsaved:    {StateWaking, StateAsleep, StateFenced, StateHeld, StateDropped},
	StateWaking:     {StateAwake, StateAsleep, StateFailed, StateUnsaved, StateDropped},
	StateAwake:      {StateSleeping},
	StateSleeping:   {StateAsleep, StateFenced, StateHeld, StateUnsaved},
	StateHeld:       {StateRechecking, StateDropped},
	StateRechecking: {StateAsleep, StateHeld, StateFenced, StateUnsaved, StateDropped},
	StateDropped:    nil,
}

// canMove reports whether the table allows from -> to.
func canMove(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// runs reports whether an instance process may exist in this state.
func (s State) runs() bool { return s == StateWaking || s == StateAwake || s == StateSleeping }

// errTransition is a refused transition: a bug in the engine, logged, never acted on.
type errTransition struct{ from, to State }

func (e errTransition) Error() string {
	return fmt.Sprintf("engine: transition %s -> %s is not allowed", e.from, e.to)
}

// refusedTransitions counts the transitions setStateLocked refused since the process
// started: any is a bug (the engine's tests fail on one they did not ask for).
var refusedTransitions atomic.Uint64

// transitional reports whether s is a wake or stop in flight (inst.trans is set).
func (s State) transitional() bool { return s == StateWaking || s == StateSleeping }

// setStateLocked moves the space to s (in.mu held). It is the only writer of in.state,
// in.since, in.here and in.trans, and ends a drain (in.draining): a move into waking or
// sleeping starts a transition (in.trans, from the state left); the move out of it closes
// its done, so its waiters see the state it moved to (and a wake's err, set before); a
// move to a state with no process ends the drain. A transition the table does not allow
// is refused: the state stays, the refusal is logged at error level and returned.
func (in *inst) setStateLocked(s State) error {
	if !canMove(in.state, s) {
		err := errTransition{in.state, s}
		refusedTransitions.Add(1)
		in.logger().Error("refused a state transition", zap.Error(err))
		return err
	}
	from := in.state
	in.state = s
	in.since = in.e.now()
	in.here.Store(s == StateAwake || s == StateWaking)
	if in.trans != nil {
		close(in.trans.done)
		in.trans = nil
	}
	if s.transitional() {
		in.trans = &transition{done: make(chan struct{}), from: from}
	}
	if !s.runs() {
		in.draining = false
	}
	in.changedLocked()
	return nil
}

// drainLocked marks a running space as draining (Drain): it gives out no new Use until
// it stops, when setStateLocked ends the drain. It reports whether the space runs.
func (in *inst) drainLocked() bool {
	if !in.state.runs() {
		return false
	}
	in.draining = true
	return true
}

// retryHold is when a space's next wake may start, and why not before.
type retryHold struct {
	at  time.Time
	why string
}

// retryLaterLocked holds the space's next wake until at, giving why (in.mu held): a
// backoff (failedWakeBackoff, crashBackoff) or a fence-out. It is the only writer of
// in.retry, and only extends it: of two reasons to wait, the longer stands.
func (in *inst) retryLaterLocked(at time.Time, why string) {
	if at.After(in.retry.at) {
		in.retry = retryHold{at: at, why: why}
	}
}

// retryWaitLocked is how long the next wake must still wait, and why (in.mu held).
func (in *inst) retryWaitLocked() (time.Duration, string) {
	return in.retry.at.Sub(in.e.now()), in.retry.why
}
