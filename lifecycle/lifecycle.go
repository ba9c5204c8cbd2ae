// Package lifecycle is a box's own lifecycle: one typed state with one writer (Machine's
// transitions), read by the engine, the mesh membership and the box, which once kept
// flags of it in step (fenced in the engine and the membership, draining in both and in
// the box).
package lifecycle

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// State is where a box is in its life.
type State uint32

const (
	// Starting: opened, its first heartbeat not written yet. Fenced: it serves and
	// writes no space.
	Starting State = iota
	// Serving: its heartbeat is written in time (or it has no mesh).
	Serving
	// Fenced: its heartbeat writes are failing; peers may soon count it dead, so it
	// serves and writes no space until a write succeeds again.
	Fenced
	// Draining: shutting down; no new wake, the awake spaces are checkpointed and
	// released.
	Draining
	// DrainingFenced: draining, and its heartbeat writes are failing: the drain writes
	// nothing until they succeed again.
	DrainingFenced
	// Closed: the drain is over and the box closed.
	Closed
)

func (s State) String() string {
	switch s {
	case Starting:
		return "starting"
	case Serving:
		return "serving"
	case Fenced:
		return "fenced"
	case Draining:
		return "draining"
	case DrainingFenced:
		return "draining, fenced"
	case Closed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", uint32(s))
}

// IsFenced reports whether a box in s serves and writes no space.
func (s State) IsFenced() bool { return s == Starting || s == Fenced || s == DrainingFenced }

// IsDraining reports whether a box in s is shutting down (it wakes no space).
func (s State) IsDraining() bool { return s == Draining || s == DrainingFenced || s == Closed }

// transitions is every allowed move, by its cause; anything else is refused.
var transitions = map[State][]State{
	Starting:       {Serving, DrainingFenced, Closed},
	Serving:        {Fenced, Draining, Closed},
	Fenced:         {Serving, DrainingFenced, Closed},
	Draining:       {DrainingFenced, Closed},
	DrainingFenced: {Draining, Closed},
}

// Allowed reports whether the table allows a move from one state to another.
func Allowed(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Machine holds one box's state. Its methods are safe for concurrent use; the zero value
// is not: use New.
type Machine struct {
	state atomic.Uint32 // read by anyone; written by move only, with mu held

	// mu serializes the moves and their observers' calls.
	mu      sync.Mutex
	onFence []func(fenced bool)
}

// New is a machine in Starting: fenced until Fence(false) (the first heartbeat, or a box
// without a mesh).
func New() *Machine { return new(Machine) }

// State is the current state.
func (m *Machine) State() State { return State(m.state.Load()) }

// Fenced reports whether the box serves and writes no space now.
func (m *Machine) Fenced() bool { return m.State().IsFenced() }

// Draining reports whether the box is shutting down.
func (m *Machine) Draining() bool { return m.State().IsDraining() }

// OnFence adds f, called with the new value each time the box becomes fenced or stops
// being fenced, after the move, on the mover's goroutine, one call at a time.
func (m *Machine) OnFence(f func(fenced bool)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onFence = append(m.onFence, f)
}

// Fence moves the box into or out of its fence (the mesh membership's decision, by its
// heartbeat writes), and reports whether that changed whether it is fenced. A closed box
// stays closed.
func (m *Machine) Fence(fenced bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	from := m.State()
	if from.IsFenced() == fenced || from == Closed {
		return false
	}
	to := map[State]State{Starting: Serving, Serving: Fenced, Fenced: Serving, Draining: DrainingFenced, DrainingFenced: Draining}[from]
	m.moveLocked(from, to)
	for _, f := range m.onFence {
		f(fenced)
	}
	return true
}

// Drain moves the box into its drain, fenced or not as it was, and reports whether it was
// not draining yet. A box still Starting drains fenced: it never wrote a heartbeat.
func (m *Machine) Drain() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	from := m.State()
	if from.IsDraining() {
		return false
	}
	to := Draining
	if from.IsFenced() {
		to = DrainingFenced
	}
	m.moveLocked(from, to)
	return true
}

// Close moves the box to Closed, for good.
func (m *Machine) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if from := m.State(); from != Closed {
		m.moveLocked(from, Closed)
	}
}

// moveLocked is the one writer of the state.
func (m *Machine) moveLocked(from, to State) {
	if !Allowed(from, to) {
		panic(fmt.Sprintf("lifecycle: move %s -> %s is not in the table", from, to))
	}
	m.state.Store(uint32(to))
}
