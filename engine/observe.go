package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Event types.
const (
	EventWake       = "wake"       // a wake finished (Err set when it failed)
	EventSleep      = "sleep"      // a space went to sleep (Reason: idle, lru, requested, drain)
	EventCheckpoint = "checkpoint" // a checkpoint finished (Err set when it failed)
	EventFence      = "fence"      // a space was fenced out, or the box fenced/unfenced itself (Host "")
	EventCrash      = "crash"      // an instance exited on its own
)

// WakePhases are how long each phase of one wake took; a phase not reached is zero.
type WakePhases struct {
	Lease   time.Duration `json:"lease"`   // acquiring the space's lease
	Restore time.Duration `json:"restore"` // reading the manifest and restoring the data dir
	Fence   time.Duration `json:"fence"`   // fencing the manifest against earlier holders (one conditional PUT)
	Start   time.Duration `json:"start"`   // starting the instance process
	Ready   time.Duration `json:"ready"`   // awaiting readiness
}

// Total is the sum of the phases.
func (p WakePhases) Total() time.Duration { return p.Lease + p.Restore + p.Fence + p.Start + p.Ready }

// Event is one thing the engine did, as observers hear it.
type Event struct {
	Type string    `json:"type"`
	Host string    `json:"host,omitempty"`
	At   time.Time `json:"at"`
	// Phases of a wake.
	Phases WakePhases `json:"phases,omitzero"`
	// Order of a wake: its place among this box's wakes by when their first request
	// reached the engine (the start gate admits by it).
	Order uint64 `json:"order,omitempty"`
	// Duration of a checkpoint.
	Duration time.Duration `json:"duration,omitempty"`
	// Started is when a checkpoint began, before it read anything of the space's files
	// (on this process's monotonic clock when read in it): what was written before it is
	// in the checkpoint.
	Started time.Time `json:"started,omitzero"`
	// Bytes uploaded by a checkpoint.
	Bytes int64 `json:"bytes,omitempty"`
	// Size of the space's files after a wake or checkpoint.
	Size int64 `json:"size,omitempty"`
	// Reason of a sleep, or what a fence event means.
	Reason string `json:"reason,omitempty"`
	// Err is why a wake or checkpoint failed; never holds a secret (engine errors name
	// hosts, phases and bucket keys only).
	Err string `json:"error,omitempty"`
}

// Observer hears the engine's events. It is called synchronously on the engine's own
// goroutines, possibly with locks held: it must return quickly and never call back into
// the engine.
type Observer func(Event)

// observers is the engine's observer list: copy-on-write, so emit reads it with one load.
type observers struct {
	mu   sync.Mutex // serializes Observe and its cancel; emit does not take it
	list atomic.Pointer[[]*Observer]
}

// Observe adds o to the engine's observers and returns a func that removes it.
func (e *Engine) Observe(o Observer) (cancel func()) {
	p := &o
	e.obs.mu.Lock()
	var next []*Observer
	if cur := e.obs.list.Load(); cur != nil {
		next = append(next, *cur...)
	}
	next = append(next, p)
	e.obs.list.Store(&next)
	e.obs.mu.Unlock()
	return func() {
		e.obs.mu.Lock()
		defer e.obs.mu.Unlock()
		cur := e.obs.list.Load()
		if cur == nil {
			return
		}
		next := make([]*Observer, 0, len(*cur))
		for _, q := range *cur {
			if q != p {
				next = append(next, q)
			}
		}
		e.obs.list.Store(&next)
	}
}

// emit stamps ev and hands it to every observer; a panicking observer is logged, not fatal.
func (e *Engine) emit(ev Event) {
	cur := e.obs.list.Load()
	if cur == nil || len(*cur) == 0 {
		return
	}
	if ev.At.IsZero() {
		ev.At = e.now()
	}
	for _, o := range *cur {
		safego.Run(e.log, "engine observer", func() { (*o)(ev) })
	}
}

// manifestSize is the total size of the files a manifest lists.
func manifestSize(m *spacestore.Manifest) int64 {
	if m == nil {
		return 0
	}
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}
