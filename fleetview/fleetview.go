// Package fleetview is what the operator's console reads: plain types for the fleet, its
// spaces and its events, the Source interface the lchat app implements (and Actions, when
// the operator switches them on), and the Recorder that keeps the short history the
// console's charts draw. It has no Caddy glue and no HTML.
package fleetview

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"
)

// Box is one live box of the fleet, as its heartbeat and its status report it.
type Box struct {
	Self         string        `json:"self"`
	Region       string        `json:"region,omitempty"`
	This         bool          `json:"this,omitempty"` // the box serving the console
	HeartbeatAge time.Duration `json:"heartbeat_age"`
	Draining     bool          `json:"draining,omitempty"`
	Fenced       bool          `json:"fenced,omitempty"`
	Version      string        `json:"version,omitempty"`
	Awake        []string      `json:"awake"`
	// WarmSet and Budget are the box's memory as its heartbeat publishes it (bytes; 0:
	// not published).
	WarmSet  int64             `json:"warm_set_bytes,omitempty"`
	Budget   int64             `json:"budget_bytes,omitempty"`
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Conns is the connections (WebSockets, event streams) the box holds, by space; a
	// space with none is left out.
	Conns map[string]Conns `json:"conns,omitempty"`
	// Error is why the box's status could not be read (its heartbeat is still live).
	Error string `json:"error,omitempty"`
}

// Fleet is every live box. Without the mesh it holds this box alone.
type Fleet struct {
	Self  string `json:"self,omitempty"`
	Mesh  bool   `json:"mesh"`
	Boxes []Box  `json:"boxes"`
}

// Region is one region's boxes.
type Region struct {
	Name  string `json:"name"` // "" for boxes without a region
	Boxes []Box  `json:"boxes"`
}

// Regions groups the boxes by region: regions by name (the unnamed last), boxes by SELF.
func (f Fleet) Regions() []Region {
	by := map[string][]Box{}
	for _, b := range f.Boxes {
		by[b.Region] = append(by[b.Region], b)
	}
	out := make([]Region, 0, len(by))
	for name, boxes := range by {
		slices.SortFunc(boxes, func(a, b Box) int { return cmp.Compare(a.Self, b.Self) })
		out = append(out, Region{Name: name, Boxes: boxes})
	}
	slices.SortFunc(out, func(a, b Region) int {
		if (a.Name == "") != (b.Name == "") {
			if a.Name == "" {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

// AwakeOn names the boxes on which host is awake.
func (f Fleet) AwakeOn(host string) []string {
	var out []string
	for _, b := range f.Boxes {
		if slices.Contains(b.Awake, host) {
			out = append(out, b.Self)
		}
	}
	slices.Sort(out)
	return out
}

// Space is one route and what this box knows of it.
type Space struct {
	Host       string `json:"host"`
	Kind       string `json:"kind,omitempty"`
	Hibernate  bool   `json:"hibernate"`
	HomeRegion string `json:"home_region,omitempty"`
	// State is this box's engine state of the space; "" when this box never ran it
	// (it is asleep here, and may be awake elsewhere: see AwakeOn).
	State         string    `json:"state,omitempty"`
	Since         time.Time `json:"since,omitzero"`
	LastSync      time.Time `json:"last_sync,omitzero"`
	LastSyncError string    `json:"last_sync_error,omitempty"`
	// Size is the bytes of the space's files as of its last wake or checkpoint here.
	Size int64 `json:"size,omitempty"`
	// AwakeOn names the boxes where the space is awake (filled by Join).
	AwakeOn []string `json:"awake_on,omitempty"`
	// Conns is the space's connections (WebSockets, event streams) held by this box; nil
	// when none.
	Conns *Conns `json:"conns,omitempty"`
	// FleetConns sums the space's held connections over every live box whose status
	// was read, and HeldOn names those boxes (filled by Join); nil and empty when none.
	// A client's socket is held by the box it connected to, wherever the space is awake.
	FleetConns *Conns   `json:"fleet_conns,omitempty"`
	HeldOn     []string `json:"held_on,omitempty"`
	// Durability is the kind's (docs/durability.md) as this box runs it; "" when it never
	// ran the space. Log is its log while awake here with durability bucket.
	Durability string `json:"durability,omitempty"`
	Log        *Log   `json:"log,omitempty"`
}

// Log is an awake space's log and output gate (durability bucket).
type Log struct {
	Segments uint64 `json:"segments"`
	// Waiting answers at the gate now, and Lag, how long the oldest has waited.
	Waiting int           `json:"waiting"`
	Lag     time.Duration `json:"lag_ns"`
	// WaitP50 and WaitP99 are the gate's recent waits; Failed the answers refused (503).
	WaitP50 time.Duration `json:"wait_p50_ns"`
	WaitP99 time.Duration `json:"wait_p99_ns"`
	Failed  uint64        `json:"failed"`
}

// Conns counts one space's connections held by a box (docs/connections.md): its
// WebSockets and its resumable event streams.
type Conns struct {
	// Open WebSockets have their socket up; Parked of them wait with no goroutine.
	Open   int `json:"open"`
	Parked int `json:"parked"`
	// Streams is the resumable event streams (server-sent events) the box holds open.
	Streams int `json:"streams"`
	// PendingBytes is the bytes of client messages the box keeps for the space's
	// instances (undelivered, or acknowledged and not yet checkpointed).
	PendingBytes int64 `json:"pending_bytes"`
}

// Stored is a space's state in the bucket, from its manifest: what any box would
// restore on the next wake.
type Stored struct {
	Generation int64     `json:"generation"`
	Files      int       `json:"files"`
	Size       int64     `json:"size"`
	WrittenBy  string    `json:"written_by,omitempty"`
	WrittenAt  time.Time `json:"written_at,omitzero"`
	NextWake   time.Time `json:"next_wake,omitzero"` // zero: none
}

// HeldOn sums host's held connections over the fleet's boxes and names the boxes that
// hold any, sorted; zero and nil when none does.
func (f Fleet) HeldOn(host string) (Conns, []string) {
	var sum Conns
	var on []string
	for _, b := range f.Boxes {
		c, ok := b.Conns[host]
		if !ok {
			continue
		}
		sum.Open += c.Open
		sum.Parked += c.Parked
		sum.Streams += c.Streams
		sum.PendingBytes += c.PendingBytes
		on = append(on, b.Self)
	}
	slices.Sort(on)
	return sum, on
}

// Join fills each space's AwakeOn, FleetConns and HeldOn from the fleet.
func Join(spaces []Space, f Fleet) {
	for i := range spaces {
		sp := &spaces[i]
		sp.AwakeOn = f.AwakeOn(sp.Host)
		sp.FleetConns, sp.HeldOn = nil, nil
		if sum, on := f.HeldOn(sp.Host); len(on) > 0 {
			sp.FleetConns, sp.HeldOn = &sum, on
		}
	}
}

// Stats are this box's running totals, sampled by the Recorder.
type Stats struct {
	// Requests handled by the lchat handler; BucketRequests sent to the bucket. Both
	// only grow (since the process started).
	Requests       uint64 `json:"requests"`
	BucketRequests uint64 `json:"bucket_requests"`
	// Awake is the number of spaces awake on this box.
	Awake int `json:"awake"`
	// Held is the connections this box holds, every space: open WebSockets and event
	// streams.
	Held int `json:"held"`
}

// DERP is the DERP region-switch app's state, for the chart of the home region.
type DERP struct {
	Home       int    `json:"home"` // 0 while no home is connected
	Pin        int    `json:"pin,omitempty"`
	PinPending bool   `json:"pin_pending,omitempty"`
	State      string `json:"state,omitempty"`
	Commits    uint64 `json:"commits"` // make-before-break switches committed
}

// Phases are the durations of one wake's phases.
type Phases struct {
	Lease   time.Duration `json:"lease"`
	Restore time.Duration `json:"restore"`
	Fence   time.Duration `json:"fence"`
	Start   time.Duration `json:"start"`
	Ready   time.Duration `json:"ready"`
}

// Total is the sum of the phases.
func (p Phases) Total() time.Duration { return p.Lease + p.Restore + p.Fence + p.Start + p.Ready }

// Event types beyond the engine's (wake, sleep, checkpoint, fence, crash).
const (
	EventWake        = "wake"
	EventSleep       = "sleep"
	EventCheckpoint  = "checkpoint"
	EventFence       = "fence"
	EventCrash       = "crash"
	EventBoxJoined   = "box_joined"
	EventFailover    = "failover" // a box's heartbeat went missing: its spaces are free
	EventDraining    = "draining"
	EventReplication = "replication"
	EventDERPSwitch  = "derp_switch"
)

// Event is one thing that happened, as the console lists it.
type Event struct {
	Seq    uint64    `json:"seq"`
	At     time.Time `json:"at"`
	Type   string    `json:"type"`
	Host   string    `json:"host,omitempty"`
	Box    string    `json:"box,omitempty"`
	Detail string    `json:"detail,omitempty"`
	// Phases of a wake.
	Phases *Phases `json:"phases,omitempty"`
	Err    string  `json:"error,omitempty"`
}

// Source is what the console reads. The lchat app implements it; its methods are safe for
// concurrent use.
type Source interface {
	// Fleet reads every live box (this one alone without the mesh).
	Fleet(ctx context.Context) (Fleet, error)
	// Spaces lists up to limit routes whose host contains search (all when empty),
	// sorted by host.
	Spaces(ctx context.Context, search string, limit int) ([]Space, error)
	// Stored reads host's manifest from the bucket; ok is false for a space never
	// checkpointed. One bucket read: the console calls it for one space's page only.
	Stored(ctx context.Context, host string) (st Stored, ok bool, err error)
	// Stats reads this box's totals.
	Stats() Stats
	// Subscribe calls f for every event on this box until cancel is called. f must
	// not block.
	Subscribe(f func(Event)) (cancel func())
}

// DERPSource reads the DERP region-switch app; ok is false when it is not configured.
type DERPSource interface {
	DERP() (d DERP, ok bool)
}

// Actions are the console's write actions, offered only when the operator switches them
// on. Each returns an error a person can read.
type Actions interface {
	// Hibernate puts an awake space to sleep now (checkpoint, release its lease).
	Hibernate(ctx context.Context, host string) error
	Relocate(ctx context.Context, host, region string, moveDNS bool) error
	Remove(ctx context.Context, host string) error
}

// Match reports whether host matches a console search: a case-insensitive substring.
func Match(host, search string) bool {
	return search == "" || strings.Contains(strings.ToLower(host), strings.ToLower(strings.TrimSpace(search)))
}
