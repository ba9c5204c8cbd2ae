// Package adminapi is the wire format of the lchat endpoints on Caddy's admin API
// (/lchat/...): the requests the CLI sends and the server decodes, and the answers the
// server encodes and the CLI reads. One home for both sides (modules/lchat serves them,
// modules/lchatcli calls them); plain types, no Caddy. Decode is the strict body decode of
// every admin endpoint, derp_switch's too.
package adminapi

import (
	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// RoutesPage is the GET /lchat/routes answer.
type RoutesPage struct {
	Routes []registry.Summary `json:"routes"`
	// Next is the `after` of the next page; empty on the last page.
	Next string `json:"next,omitempty"`
}

// CreateRequest is the POST /lchat/routes body: a registry.Spec.
type CreateRequest struct {
	Host       string            `json:"host"`
	Kind       string            `json:"kind,omitempty"`
	Version    string            `json:"version,omitempty"`
	Hibernate  *bool             `json:"hibernate,omitempty"`
	HomeRegion string            `json:"home_region,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Upstream   string            `json:"upstream,omitempty"`
	// Mint names the host from the next id instead: <base36(id)>.<first wildcard
	// domain>, the id drawn from LCHAT_CLOUD_ID_LEDGER's ledger (a local counter
	// without it). Host must then be empty.
	Mint bool `json:"mint,omitempty"`
}

// HibernateRequest is the POST /lchat/routes/{host}/hibernate body.
type HibernateRequest struct {
	Hibernate *bool `json:"hibernate"`
	// Upstream is the live upstream when turning hibernation off.
	Upstream string `json:"upstream,omitempty"`
}

// Status is the GET /lchat/status answer: this box's status (box.Status) and the build
// that runs it (buildinfo.String: "lchat-caddy <build> (Caddy <version>)").
type Status struct {
	Version string `json:"version"`
	box.Status
}

// Spaces is the GET /lchat/spaces answer: every route (or the one ?host= names) with
// its state on this box, the boxes it is awake on, its held connections over the fleet
// and its last checkpoint.
type Spaces struct {
	Spaces []box.SpaceReport `json:"spaces"`
}

// HistoryResponse is the GET /lchat/routes/{host}/history answer.
type HistoryResponse struct {
	Host        string                  `json:"host"`
	Checkpoints []spacestore.Checkpoint `json:"checkpoints"`
}

// RestoreRequest is the POST /lchat/routes/{host}/restore body; the answer is a
// spacestore.RestoreResult.
type RestoreRequest struct {
	At string `json:"at"`
}

// FleetMember is one box in GET /lchat/fleet: the fleet's box, its heartbeat age said as
// a duration ("1.5s").
type FleetMember struct {
	fleetview.Box
	HeartbeatAge string `json:"heartbeat_age"`
}

// Fleet is the GET /lchat/fleet answer.
type Fleet struct {
	Self    string        `json:"self"`
	Members []FleetMember `json:"members"`
	// Capacity is the fleet's memory and the box count it wants, as this box computes it
	// from its last listing (the lchat_fleet_desired_boxes metric).
	Capacity *FleetCapacity `json:"capacity,omitempty"`
}

// FleetCapacity is the fleet's memory and desired box count (mesh.FleetOf).
type FleetCapacity struct {
	// Boxes is the live boxes that are not draining.
	Boxes int `json:"boxes"`
	// WarmSet is the fleet's warm set in bytes; BoxBudget the mean budget of a box.
	WarmSet   int64 `json:"warm_set_bytes"`
	BoxBudget int64 `json:"box_budget_bytes"`
	// DesiredBoxes is lchat_fleet_desired_boxes: 0 when no box publishes a budget.
	DesiredBoxes int `json:"desired_boxes"`
	// Headroom and Hysteresis are the shares it was computed with.
	Headroom   float64 `json:"headroom"`
	Hysteresis float64 `json:"hysteresis"`
	// BoxWarmSet and BoxBudgetOwn are this box's (lchat_box_warm_set_bytes,
	// lchat_box_memory_budget_bytes).
	BoxWarmSet   int64 `json:"box_warm_set_bytes"`
	BoxBudgetOwn int64 `json:"box_memory_budget_bytes"`
}

// SeedRequest is the POST /lchat/mesh/seed body; the answer is a stream of SeedEvent
// lines.
type SeedRequest struct {
	Peer   string `json:"peer"`
	Region string `json:"region,omitempty"`
	Prune  bool   `json:"prune,omitempty"`
	// Domains override the box's mesh domains as the seed's scope (from --env-file).
	Domains []string `json:"domains,omitempty"`
	// Token overrides the box's mesh token for the peer (from --env-file). Never echoed.
	Token string `json:"token,omitempty"`
}

// SeedEvent is one line of mesh-seed progress.
type SeedEvent = mesh.SeedEvent

// RelocateRequest is the POST /lchat/mesh/relocate/{host} body.
type RelocateRequest struct {
	To      string `json:"to"`
	MoveDNS bool   `json:"move_dns,omitempty"`
}

// RelocateResult is the answer of a relocation.
type RelocateResult = mesh.RelocateResult

// IDResult is the POST /lchat/ids answer.
type IDResult struct {
	Namespace string `json:"namespace"`
	ID        uint64 `json:"id"`
}

// SeedIDsRequest is the POST /lchat/ids/seed body: every id handed out afterwards is at
// least Min.
type SeedIDsRequest struct {
	Min uint64 `json:"min"`
}

// SeedIDsResult is the POST /lchat/ids/seed answer.
type SeedIDsResult struct {
	Namespace string `json:"namespace"`
	// Next is the lowest id the ledger may hand out now.
	Next uint64 `json:"next"`
}
