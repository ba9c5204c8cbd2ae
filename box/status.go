package box

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// Status is this box's status (GET /lchat/status).
type Status struct {
	Routes   int                  `json:"routes"`
	Spaces   []engine.SpaceStatus `json:"spaces"`
	Counters map[string]uint64    `json:"counters"`
	// Conns is the WebSocket connections this box holds, by space (host); a space with
	// none is left out.
	Conns map[string]fleetview.Conns `json:"conns,omitempty"`
	Mesh  *MeshStatus                `json:"mesh,omitempty"`
}

// Status reads this box's routes, spaces and counters, and its mesh status.
func (b *Box) Status() Status {
	st := Status{Routes: b.reg.Len(), Spaces: b.Spaces(), Counters: b.counters()}
	if b.mesh == nil {
		st.Conns = b.SpaceConns()
		return st
	}
	// One walk of the held connections: the mesh document's, said once, at the top.
	ms := b.MeshStatus()
	st.Conns, ms.Conns = ms.Conns, nil
	st.Mesh = &ms
	return st
}

// Spaces is every space the engine knows, by host.
func (b *Box) Spaces() []engine.SpaceStatus { return b.eng.Status() }

// EngineCounters is the engine's counters by name, the names of their JSON form
// (lease_conflicts, oom_kills, ...): one flattening for the status documents, the fleet
// and the metrics.
func EngineCounters(c engine.Counters) map[string]uint64 {
	raw, err := json.Marshal(c)
	if err != nil {
		return nil
	}
	var out map[string]uint64
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil
	}
	return out
}

// MeshStatus is this box's status document in the mesh (GET /api/mesh/status), which the
// fleet reads from every box. It holds no secret.
type MeshStatus struct {
	Self         string            `json:"self"`
	Region       string            `json:"region,omitempty"`
	Domains      []string          `json:"domains"`
	Version      string            `json:"version"`
	Incarnation  string            `json:"incarnation"`
	HeartbeatAge string            `json:"heartbeat_age"`
	Fenced       bool              `json:"fenced"`
	Draining     bool              `json:"draining"`
	Routes       int               `json:"routes"`
	Awake        []string          `json:"awake"`
	Live         []string          `json:"live_members"`
	Counters     map[string]uint64 `json:"counters"`
	// Conns is the WebSocket connections this box holds, by space, as in Status: the
	// console sums a space's over the fleet.
	Conns      map[string]fleetview.Conns `json:"conns,omitempty"`
	Membership any                        `json:"membership"`
	// StandbyFor is the spaces this box stands by for: the streams its spool keeps.
	StandbyFor []StandbyFor `json:"standby_for,omitempty"`
	// StandbyTotals is this box's streams and takeovers since it started.
	StandbyTotals *engine.StandbyTotals `json:"standby_totals,omitempty"`
}

// MeshStatus reads this box's mesh status document; its counters are the mesh's and the
// engine's. The mesh must be on.
func (b *Box) MeshStatus() MeshStatus {
	ms := b.mesh
	st := MeshStatus{
		Self:         ms.cfg.Self,
		Region:       ms.cfg.Region,
		Domains:      ms.cfg.Domains,
		Version:      ms.version,
		Incarnation:  ms.m.Config().Incarnation,
		HeartbeatAge: ms.m.Self().Age.Round(time.Millisecond).String(),
		Fenced:       ms.m.Fenced(),
		Draining:     ms.m.Draining(),
		Routes:       b.reg.Len(),
		Awake:        b.awake(),
		Counters:     ms.Counters(),
		Conns:        b.SpaceConns(),
		Membership:   ms.m.Stats(),
		StandbyFor:   b.standbyFor(),
	}
	tot := b.StandbyTotals()
	st.StandbyTotals = &tot
	for _, m := range ms.m.Live() {
		st.Live = append(st.Live, m.Self)
	}
	maps.Copy(st.Counters, b.counters())
	return st
}

// SetCounters adds f's counters to the box's own (Status, MeshStatus, Fleet): the glue's
// parts that the box does not own, such as held connections (conns_open, conns_parked).
// Set once, when the box is opened.
func (b *Box) SetCounters(f func() map[string]uint64) { b.extraCounters.Store(&f) }

// SetSpaceConns sets where the box reads the WebSocket connections it holds, by space
// (Status, the console): the glue's hub, which the box does not own. Set once, when the
// box is opened.
func (b *Box) SetSpaceConns(f func() map[string]fleetview.Conns) { b.spaceConns.Store(&f) }

// SpaceConns is the WebSocket connections this box holds, by space; nil when it holds
// none.
func (b *Box) SpaceConns() map[string]fleetview.Conns {
	f := b.spaceConns.Load()
	if f == nil {
		return nil
	}
	m := (*f)()
	if len(m) == 0 {
		return nil
	}
	return m
}

// counters is the engine's counters and the extra ones (SetCounters).
func (b *Box) counters() map[string]uint64 {
	c := EngineCounters(b.eng.Counters())
	if f := b.extraCounters.Load(); f != nil {
		if c == nil {
			c = map[string]uint64{}
		}
		maps.Copy(c, (*f)())
	}
	return c
}

// awake lists the hosts awake on this box.
func (b *Box) awake() []string {
	out := []string{}
	for _, s := range b.eng.Status() {
		if s.State == engine.StateAwake {
			out = append(out, s.Host)
		}
	}
	return out
}

// name is how the fleet names this box: its SELF with the mesh, else its host name.
func (b *Box) name() string {
	if b.mesh != nil {
		return b.mesh.cfg.Self
	}
	host, _ := os.Hostname()
	return host
}

// statusReadTimeout bounds reading one peer's status for the fleet.
const statusReadTimeout = 5 * time.Second

// Fleet reads every live box: this one from memory, each peer through its status
// document (GET /api/mesh/status), all at once; a peer that cannot be read is listed with
// the error, from its heartbeat. Without the mesh it is this box alone, named by its host
// name. GET /lchat/fleet (the `fleet` CLI) and the console both read it.
func (b *Box) Fleet(ctx context.Context) fleetview.Fleet {
	ms := b.mesh
	if ms == nil {
		host := b.name()
		return fleetview.Fleet{Self: host, Boxes: []fleetview.Box{{
			Self: host, This: true, Awake: b.awake(), Version: b.cfg.Version, Counters: b.counters(), Conns: b.SpaceConns(),
		}}}
	}
	live := ms.m.Live()
	f := fleetview.Fleet{Self: ms.cfg.Self, Mesh: true, Boxes: make([]fleetview.Box, len(live))}
	var wg sync.WaitGroup
	for i, m := range live {
		fb := &f.Boxes[i]
		fb.Self, fb.Region, fb.Version, fb.HeartbeatAge, fb.Draining = m.Self, m.Region, m.Version, m.Age, m.Draining
		fb.WarmSet, fb.Budget = m.WarmSet, m.Budget
		if m.Self == ms.cfg.Self {
			st := b.MeshStatus()
			fb.This, fb.Fenced, fb.Draining, fb.Awake, fb.Counters, fb.Conns = true, st.Fenced, st.Draining, st.Awake, st.Counters, st.Conns
			continue
		}
		safego.Go(&wg, b.logger.With(zap.String("peer", m.Self)), "fleet status read", func() {
			fb.Error = "reading status: internal error" // until it is read
			rctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
			defer cancel()
			raw, err := ms.client.Status(rctx, m.Self)
			if err != nil {
				fb.Error = err.Error()
				return
			}
			var st MeshStatus
			if err := json.Unmarshal(raw, &st); err != nil {
				fb.Error = fmt.Sprintf("decoding status: %v", err)
				return
			}
			fb.Fenced, fb.Awake, fb.Counters, fb.Conns, fb.Error = st.Fenced, st.Awake, st.Counters, st.Conns, ""
		})
	}
	wg.Wait()
	return f
}
