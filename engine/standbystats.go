package engine

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The standby totals of an engine (standby.go), for the metrics and the status: a space's
// StandbyStatus counts from its wake, these from the engine's creation, so a space that
// sleeps takes nothing away from them.

// EventTakeover is the event of a space taken over from a holder found dead before its
// heartbeat said so (TakeOver, NoteTakeover): Duration is how long the takeover took,
// Reason names the holder and why it was found dead, Err why it failed.
const EventTakeover = "takeover"

// recentTakeovers is how many takeovers StandbyTotals lists.
const recentTakeovers = 16

// Takeover is one takeover of a space (TakeOver), as its caller timed it.
type Takeover struct {
	Host string `json:"host"`
	// Holder is the box found dead, Why how ("its address refuses connections",
	// "restarted").
	Holder string    `json:"holder"`
	Why    string    `json:"why,omitempty"`
	At     time.Time `json:"at"`
	// Took runs from the verdict to the space awake here (or the failure).
	Took time.Duration `json:"took_ns"`
	Err  string        `json:"error,omitempty"`
	// Warm: the takeover downloaded no checkpoint (its data dir was this box's warm
	// standby copy, prewarm.go); false: it restored from the bucket.
	Warm bool `json:"warm"`
}

// StandbyTotals are an engine's streams and takeovers since it was created.
type StandbyTotals struct {
	// Streamed is the segments its spaces' standbys took; Lost the standbys given up
	// (their spaces then waited for bucket proofs).
	Streamed uint64 `json:"streamed"`
	Lost     uint64 `json:"lost"`
	// Takeovers counts the spaces taken over from a dead holder, TakeoverFailures those
	// that failed; Recent lists the last ones, newest first.
	Takeovers        uint64     `json:"takeovers"`
	TakeoverFailures uint64     `json:"takeover_failures"`
	Recent           []Takeover `json:"recent_takeovers,omitempty"`
}

// standbyTotals is one engine's totals. The counters are atomics (the stream's senders
// write them); recent is guarded by mu.
type standbyTotals struct {
	streamed, lost, takeovers, failures atomic.Uint64

	mu     sync.Mutex
	recent []Takeover // oldest first, at most recentTakeovers
}

func (e *Engine) standbyTotals() *standbyTotals { return &e.standby }

// noteStreamed counts a segment d's standby took, in d's status and the engine's totals.
func (e *Engine) noteStreamed(d *durable) {
	d.streamed.Add(1)
	e.standbyTotals().streamed.Add(1)
}

// noteStandbyLost counts a standby d gave up, in d's status and the engine's totals.
func (e *Engine) noteStandbyLost(d *durable) {
	d.standbyLost.Add(1)
	e.standbyTotals().lost.Add(1)
}

// NoteTakeover records a takeover the caller ran (TakeOver) and timed, and tells the
// engine's observers (EventTakeover). A refusal of a space that is not of standby
// durability (ErrNotStandby) is no takeover: the caller does not note it.
func (e *Engine) NoteTakeover(t Takeover) {
	if t.At.IsZero() {
		t.At = e.now()
	}
	if in := e.lookup(t.Host); in != nil && t.Err == "" {
		t.Warm = in.lastWakeKept.Load()
	}
	tt := e.standbyTotals()
	tt.takeovers.Add(1)
	if t.Err != "" {
		tt.failures.Add(1)
	}
	tt.mu.Lock()
	tt.recent = append(tt.recent, t)
	if len(tt.recent) > recentTakeovers {
		tt.recent = slices.Delete(tt.recent, 0, len(tt.recent)-recentTakeovers)
	}
	tt.mu.Unlock()
	reason := "from " + t.Holder
	if t.Why != "" {
		reason += " (" + t.Why + ")"
	}
	reason += fmt.Sprintf(" in %s", t.Took.Round(time.Millisecond))
	if t.Err == "" && !t.Warm {
		reason += ", restored from the bucket"
	}
	e.emit(Event{Type: EventTakeover, Host: t.Host, At: t.At, Duration: t.Took, Reason: reason, Err: t.Err})
}

// StandbyTotals reads the engine's totals.
func (e *Engine) StandbyTotals() StandbyTotals {
	tt := e.standbyTotals()
	out := StandbyTotals{Streamed: tt.streamed.Load(), Lost: tt.lost.Load(), Takeovers: tt.takeovers.Load(), TakeoverFailures: tt.failures.Load()}
	tt.mu.Lock()
	out.Recent = slices.Clone(tt.recent)
	tt.mu.Unlock()
	slices.Reverse(out.Recent)
	return out
}

// StreamStatus is how far an awake space's standby is behind its instance's answers: the
// segments of its stream cut and not yet on the standby's disk, and how long recent ones
// took from their cut to the standby's answer.
type StreamStatus struct {
	Gen      int64         `json:"gen"`
	Landing  int           `json:"landing"`
	LandTime time.Duration `json:"land_ns"`
}

// StreamStatus reads host's stream; ok false when host is not awake here or has no stream
// (its kind's durability is not standby, or this box has no mesh).
func (e *Engine) StreamStatus(host string) (StreamStatus, bool) {
	in := e.lookup(host)
	if in == nil {
		return StreamStatus{}, false
	}
	d := in.durableOf()
	if d == nil || d.sb == nil {
		return StreamStatus{}, false
	}
	st := d.sb.gate.Stats()
	return StreamStatus{Gen: d.sb.cur.Load().gen, Landing: st.Landing, LandTime: st.LandTime}, true
}
