package mesh

import "math"

// Load is what a box publishes of its memory in its heartbeat: the warm set (what its awake
// spaces and the connections it holds take), the budget it has for spaces, and how many
// spaces are awake. Every box reads every box's Load from the one listing of heartbeats it
// makes on each beat, which is what lets bounded-load placement (Placement.Target) and the
// fleet's desired size (FleetOf) agree across boxes with no coordinator.
type Load struct {
	// WarmSet is the bytes the box's awake spaces take (their cgroups' memory, or their
	// processes' resident memory without one) plus what the connections it holds cost it.
	WarmSet int64 `json:"warm_set,omitempty"`
	// Budget is the bytes the box has for spaces: configured (memory_budget), or the box's
	// memory less a reserve. 0: not published (an older box), no bound.
	Budget int64 `json:"budget,omitempty"`
	// Awake is the number of spaces awake on the box.
	Awake int `json:"awake,omitempty"`
}

// LoadSteps is how finely a published warm set follows the measured one: a box rewrites its
// heartbeat's load only when its warm set has moved by a step, Budget/LoadSteps (or
// MinLoadStep without a budget), or its budget changed. The heartbeat body stays
// byte-identical between such moves, so the steady state still costs peers no GETs (see
// Membership); each move costs each peer one GET at its next listing.
const LoadSteps = 32

// MinLoadStep is the step of a box that publishes no budget.
const MinLoadStep = 16 << 20

// PublishLoad is the load a box writes in its heartbeat, given what it wrote last
// (published) and what it measured now: the measured load when it moved by at least a step
// (LoadSteps) or the budget changed, else the published one unchanged.
func PublishLoad(published, measured Load) Load {
	step := int64(MinLoadStep)
	if measured.Budget > 0 {
		step = max(measured.Budget/LoadSteps, 1)
	}
	d := measured.WarmSet - published.WarmSet
	if measured.Budget != published.Budget || d >= step || -d >= step ||
		(published.WarmSet == 0) != (measured.WarmSet == 0) {
		return measured
	}
	return published
}

// Autoscale is how the fleet's desired box count is computed from its warm set (FleetOf).
type Autoscale struct {
	// Headroom is the share of the budget kept free on every box: with 0.2 the fleet wants
	// enough boxes for its warm set to fill 1/1.2 of their budgets. Default 0.2.
	Headroom float64
	// Hysteresis is the extra share the warm set must fall by before the fleet wants a box
	// fewer than it runs, so a warm set near a boundary does not flap a box in and out.
	// Default 0.1.
	Hysteresis float64
}

// Autoscale defaults.
const (
	DefaultHeadroom   = 0.2
	DefaultHysteresis = 0.1
)

// WithDefaults is a with its zero fields set to the defaults.
func (a Autoscale) WithDefaults() Autoscale {
	if a.Headroom <= 0 {
		a.Headroom = DefaultHeadroom
	}
	if a.Hysteresis <= 0 {
		a.Hysteresis = DefaultHysteresis
	}
	return a
}

// Fleet is the fleet's memory as one listing of heartbeats shows it.
type Fleet struct {
	// Boxes is the live members that are not draining: what the fleet runs.
	Boxes int `json:"boxes"`
	// WarmSet is the sum of the live members' warm sets, draining ones included (their
	// spaces wake elsewhere next).
	WarmSet int64 `json:"warm_set_bytes"`
	// Awake is the sum of the live members' awake spaces.
	Awake int `json:"awake"`
	// BoxBudget is the mean budget of the members that publish one: what one more box adds.
	BoxBudget int64 `json:"box_budget_bytes"`
	// Desired is the number of boxes the fleet wants (FleetOf); 0 when no member publishes
	// a budget.
	Desired int `json:"desired_boxes"`
}

// FleetOf sums the members' loads and decides how many boxes the fleet wants: enough for
// its warm set to fill at most 1/(1+Headroom) of their budgets, never fewer than one. Above
// what the fleet runs, that count is the answer at once (scale out early); below, the
// fleet gives a box up only when even the count with Headroom+Hysteresis is below what it
// runs. The rule reads nothing but the listing, so every box that made the same listing
// gives the same answer, whichever box an autoscaler asks.
func FleetOf(members []Member, a Autoscale) Fleet {
	a = a.WithDefaults()
	var f Fleet
	var budgets int64
	var withBudget int
	for i := range members {
		m := &members[i]
		f.WarmSet += m.WarmSet
		f.Awake += m.Awake
		if m.Draining {
			continue
		}
		f.Boxes++
		if m.Budget > 0 {
			budgets += m.Budget
			withBudget++
		}
	}
	if withBudget == 0 {
		return f
	}
	f.BoxBudget = budgets / int64(withBudget)
	need := func(share float64) int {
		return max(1, int(math.Ceil(float64(f.WarmSet)*(1+share)/float64(f.BoxBudget))))
	}
	up := need(a.Headroom)
	if up >= f.Boxes {
		f.Desired = up
		return f
	}
	f.Desired = min(f.Boxes, need(a.Headroom+a.Hysteresis))
	return f
}
