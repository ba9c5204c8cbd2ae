package box

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/engine"
)

// What an operator reads of the warm standbys (issue 38): the spaces a box stands by for,
// its streams' and takeovers' totals, and an awake space's stream.

// StandbyFor is the spaces this box stands by for, as MeshStatus lists them; nil without
// a mesh (no spool).
func (b *Box) StandbyFor() []StandbyFor { return b.standbyFor() }

// StandbyTotals is this box's streams (the segments its spaces' standbys took, the
// standbys given up) and takeovers since it started.
func (b *Box) StandbyTotals() engine.StandbyTotals { return b.eng.StandbyTotals() }

// NoteTakeover records a takeover of host from holder, found dead because why, that took
// took (err nil: the space is awake here): in StandbyTotals, the engine's events (the
// console's list, the metrics' lchat_standby_takeover_seconds). A refusal because the
// space is not of standby durability (engine.ErrNotStandby) is no takeover and is not
// recorded.
func (b *Box) NoteTakeover(host, holder, why string, took time.Duration, err error) {
	if errors.Is(err, engine.ErrNotStandby) {
		return
	}
	t := engine.Takeover{Host: host, Holder: holder, Why: why, Took: took}
	if err != nil {
		t.Err = err.Error()
	}
	b.eng.NoteTakeover(t)
}

// SpaceStandby is an awake space's stream as the console shows it.
type SpaceStandby struct {
	// Log is the space's log status: Log.Standby names its standby or why it has none.
	Log engine.DurableStatus `json:"log"`
	// Stream is how far the standby is behind the answers; nil without a stream (no
	// standby can be had: this box has no mesh).
	Stream *engine.StreamStatus `json:"stream,omitempty"`
}

// SpaceStandby reads host's stream on this box; ok false when the space is not awake here
// or its kind's durability is not standby.
func (c Console) SpaceStandby(host string) (SpaceStandby, bool) {
	for _, st := range c.b.eng.Status() {
		if st.Host != host {
			continue
		}
		if st.Durability != engine.DurabilityStandby || st.Log == nil {
			return SpaceStandby{}, false
		}
		out := SpaceStandby{Log: *st.Log}
		if s, ok := c.b.eng.StreamStatus(host); ok {
			out.Stream = &s
		}
		return out, true
	}
	return SpaceStandby{}, false
}

// BoxStandby is what a box of the fleet stands by for, and its totals.
type BoxStandby struct {
	Self       string       `json:"self"`
	StandbyFor []StandbyFor `json:"standby_for"`
	// Totals is nil for a peer whose status document does not carry them.
	Totals *engine.StandbyTotals `json:"standby_totals,omitempty"`
}

// BoxStandby reads what box self stands by for: this box's from memory ("" names it too),
// a live peer's from its status document (GET /api/mesh/status). A name that is not a
// live member of the mesh is refused, never dialled.
func (c Console) BoxStandby(ctx context.Context, self string) (BoxStandby, error) {
	b := c.b
	if self == "" || self == b.name() {
		t := b.StandbyTotals()
		return BoxStandby{Self: b.name(), StandbyFor: b.StandbyFor(), Totals: &t}, nil
	}
	ms := b.mesh
	if ms == nil || !ms.node.IsLiveMember(self) {
		return BoxStandby{}, fmt.Errorf("no live box %q in this box's view of the mesh", self)
	}
	rctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	raw, err := ms.client.Status(rctx, self)
	if err != nil {
		return BoxStandby{}, fmt.Errorf("reading the status of %s: %w", self, err)
	}
	var st struct {
		StandbyFor []StandbyFor          `json:"standby_for"`
		Totals     *engine.StandbyTotals `json:"standby_totals"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return BoxStandby{}, fmt.Errorf("decoding the status of %s: %w", self, err)
	}
	return BoxStandby{Self: self, StandbyFor: st.StandbyFor, Totals: st.Totals}, nil
}
