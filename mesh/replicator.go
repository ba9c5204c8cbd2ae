package mesh

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/lchat/lchat-caddy/registry"
)

// Replicator fans this box's route changes out to its peers, in the background: a
// change never waits for a peer. A failed target is logged by the Client; mesh-seed
// --prune or a later write reconciles it.
type Replicator struct {
	Node   *Node
	Client *Client
	// Ctx ends the fan-outs still running (the mesh's own context).
	Ctx context.Context

	fanouts, fanoutErrors atomic.Uint64
}

// Put replicates a created or changed row to every live peer that covers its host or
// owns it by region.
func (r *Replicator) Put(rt registry.Route) {
	r.PutTo(rt, r.Node.Targets(rt.Host, rt.HomeRegion))
}

// PutTo replicates a row to targets.
func (r *Replicator) PutTo(rt registry.Route, targets []Member) {
	if len(targets) == 0 {
		return
	}
	r.count(r.Client.Fanout(r.Ctx, r.Node.RowFromRoute(&rt), targets))
}

// Delete fans a tombstone of revision rev out like Put.
func (r *Replicator) Delete(host, homeRegion, rev string) {
	targets := r.Node.Targets(host, homeRegion)
	if len(targets) == 0 {
		return
	}
	r.count(r.Client.FanoutDelete(r.Ctx, host, rev, targets))
}

// Counts returns the fan-out targets tried and failed so far.
func (r *Replicator) Counts() (fanouts, errors uint64) {
	return r.fanouts.Load(), r.fanoutErrors.Load()
}

// count tallies fan-out results as they arrive.
func (r *Replicator) count(results <-chan FanoutResult) {
	go func() {
		for res := range results {
			r.fanouts.Add(1)
			if res.Err != nil {
				r.fanoutErrors.Add(1)
			}
		}
	}()
}

// Targets is the set of peers a row for host must reach: live members other than self
// that cover the host by their domains, plus those whose region is homeRegion, leaving
// out draining members (they are shutting down). Sorted by Self.
func Targets(host, homeRegion string, members []Member, self string) []Member {
	var out []Member
	for _, m := range members {
		if m.Self == self || m.Draining {
			continue
		}
		if RouteInScope(host, homeRegion, m.Domains, m.Region) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Self < out[j].Self })
	return out
}

// RouteLister pages through a box's routes (registry.Registry).
type RouteLister interface {
	List(after string, limit int) ([]registry.Route, string, error)
}

// Rows is every route of routes in replicated form, env values included (they go to a
// peer only, never to the operator). A failed read is an error, never a shorter list:
// peers diff against it.
func (b *Node) Rows(routes RouteLister) ([]RouteRow, error) {
	var out []RouteRow
	after := ""
	for {
		rts, next, err := routes.List(after, 1000)
		if err != nil {
			return nil, fmt.Errorf("listing routes: %v", err)
		}
		for i := range rts {
			out = append(out, b.RowFromRoute(&rts[i]))
		}
		if next == "" {
			return out, nil
		}
		after = next
	}
}

// InScopeRows is the rows of routes in this box's scope (its domains, or its region as
// home_region), without env values: what GET /api/mesh/routes answers.
func (b *Node) InScopeRows(routes RouteLister) ([]RouteRow, error) {
	rows, err := b.Rows(routes)
	if err != nil {
		return nil, err
	}
	out := rows[:0]
	for _, row := range rows {
		if row.InScopeFor(b.Domains, b.Region) {
			row.Env = nil
			out = append(out, row)
		}
	}
	return out, nil
}
