package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

// Node is this box's place in the mesh: its identity and its live view, and the rules
// that read them: which routes it takes part in placing, who owns a host, where a
// request goes, which replicated rows and tombstones it accepts, and which peers a row
// fans out to. It holds no state of its own; Live and Draining come from the
// Membership.
type Node struct {
	// Self is this box's SELF URL.
	Self string
	// Domains are the mesh domains this box covers.
	Domains []string
	// Region is this box's region; empty means none.
	Region string
	// Live returns the live members, this box included, sorted by Self.
	Live func() []Member
	// IsDraining reports whether this box is shutting down. Nil means never.
	IsDraining func() bool
	// Holders remembers where spaces were last seen awake. Nil: placement goes by the
	// owner only.
	Holders *Holders
	// Placement, when set, answers Owner over the same view as Live, cached per host
	// until the view changes (Membership.Placement). Nil: Owner over Live on each call.
	Placement *Placement
	// Balance is bounded-load placement's ε (Target): a wake goes past its HRW owner when
	// that box's warm set plus the space would pass (1+Balance)× the mean. 0: plain HRW.
	Balance float64
	// Sizes gives the last known size of a space placement sends to where it wakes. Nil:
	// every size is unknown (the fleet's mean awake space).
	Sizes *Sizes
}

// sizeOf is host's last known size, 0 when unknown (or when placement does not weigh
// loads, so the bucket is not asked).
func (b *Node) sizeOf(host string) int64 {
	if b.Sizes == nil || b.Balance <= 0 {
		return 0
	}
	return b.Sizes.Get(context.Background(), host)
}

// target is where a space of size bytes (0: unknown) homed in homeRegion wakes, over the
// live view and its loads: bounded-load placement (Placement.Target, BoundedOwner).
func (b *Node) target(host, homeRegion string, size int64) (Member, bool) {
	if b.Placement != nil {
		return b.Placement.Target(host, homeRegion, size, b.Balance)
	}
	return BoundedOwner(host, b.Live(), homeRegion, size, b.Balance)
}

// owner is the HRW owner of host, homed in homeRegion, over the live view.
func (b *Node) owner(host, homeRegion string) (Member, bool) {
	if b.Placement != nil {
		return b.Placement.Owner(host, homeRegion)
	}
	return Owner(host, b.Live(), homeRegion)
}

func (b *Node) draining() bool { return b.IsDraining != nil && b.IsDraining() }

// InScope reports whether this box takes part in placing host, a route homed in
// homeRegion: the host is under its mesh domains, or homeRegion is its region.
func (b *Node) InScope(host, homeRegion string) bool {
	return RouteInScope(host, homeRegion, b.Domains, b.Region)
}

// IsLiveMember reports whether self is the SELF of a live box in this box's view. With a
// Placement it is a binary search of the same view, not a copy of it (it runs on the
// request path, for a space's last holder).
func (b *Node) IsLiveMember(self string) bool {
	if b.Placement != nil {
		return b.Placement.Has(self)
	}
	for _, m := range b.Live() {
		if m.Self == self {
			return true
		}
	}
	return false
}

// Owns reports whether this box is where host, homed in homeRegion, is placed: its HRW
// owner among the live boxes. A host outside this box's mesh scope is this box's own (it
// is the only one that serves it), unless it is homed in a region whose owner holds its
// row (homeOwner). Scheduled wakes fire where FiresWake says.
func (b *Node) Owns(host, homeRegion string) bool {
	if !b.InScope(host, homeRegion) {
		_, elsewhere := b.homeOwner(host, homeRegion)
		return !elsewhere
	}
	owner, ok := b.owner(host, homeRegion)
	return ok && owner.Self == b.Self
}

// WakeOverdue is how late a due scheduled wake is when its plain HRW owner fires it as
// well as the box bounded loads place it on (FiresWake): a wake whose boxes' views of the
// loads disagree, each placing it on the other, is late by this much at most, not skipped
// forever. It is several scans (engine.Config.WakeScanInterval, default 30 s) and beats:
// a wake that its target fires and retries is not fired twice for a slow first attempt.
const WakeOverdue = 2 * time.Minute

// FiresWake reports whether this box fires host's due scheduled wake (homed in
// homeRegion), late past its due time: this box is where the space wakes (target: bounded
// loads, with its last known size and the box it last woke on), the box a request for it
// would wake it on; or the wake is WakeOverdue late and this box is the host's plain HRW
// owner. A host outside this box's mesh scope is fired as Owns says.
//
// Boxes whose views of the loads differ (a beat apart, or sizes read at different times)
// may each place the wake on itself, and both fire it: the lease decides which wakes the
// space, and the other stops once the record is gone (engine's fireWake). Or each may
// place it on the other, and both skip it: then the owner fires it once it is WakeOverdue
// late. The owner's view of who owns the host changes only with membership, which every
// box sees alike within a beat, so a wake is late at most WakeOverdue plus a scan, never
// skipped for good.
func (b *Node) FiresWake(host, homeRegion string, late time.Duration) bool {
	if !b.InScope(host, homeRegion) {
		return b.Owns(host, homeRegion)
	}
	if to, ok := b.target(host, homeRegion, b.sizeOf(host)); ok && to.Self == b.Self {
		return true
	}
	return late >= WakeOverdue && b.Owns(host, homeRegion)
}

// homeOwner is where a route outside this box's scope goes instead of being served
// here: the route has a home region, and its owner is another box that takes part in
// placing it (a live box of that region; or, with none live, a fallback owner whose
// domains cover the host). A box outside the scope holds such a row only when it was
// created there; its peers that place it got it by fan-out.
func (b *Node) homeOwner(host, homeRegion string) (string, bool) {
	if homeRegion == "" {
		return "", false
	}
	owner, ok := b.owner(host, homeRegion)
	if !ok || owner.Self == b.Self || !RouteInScope(host, homeRegion, owner.Domains, owner.Region) {
		return "", false
	}
	return owner.Self, true
}

// Targets is the set of peers a row for host, homed in homeRegion, fans out to (see
// the package function Targets).
func (b *Node) Targets(host, homeRegion string) []Member {
	return Targets(host, homeRegion, b.Live(), b.Self)
}

// RowFromRoute is the replicated form of a registry row on this box: a live route served
// here is pinned to this box's SELF.
func (b *Node) RowFromRoute(rt *registry.Route) RouteRow {
	row := RouteRow{
		Host:          rt.Host,
		Kind:          rt.Kind,
		Version:       rt.Version,
		Hibernate:     rt.Hibernate,
		HomeRegion:    rt.HomeRegion,
		Env:           rt.Env,
		Rev:           rt.Rev,
		Provider:      rt.Provider,
		ProviderState: rt.ProviderState,
		HostedFor:     rt.HostedFor,
	}
	if !rt.Hibernate {
		row.LivesAt = rt.LivesAt
		if row.LivesAt == "" {
			row.LivesAt = b.Self
		}
	}
	return row
}

// RouteFromRow is the registry form of a replicated row. A live space pinned to a peer
// becomes a lives_at row with no upstream: requests for it are forwarded to LivesAt and
// nothing is ever dialed for it locally.
func RouteFromRow(row RouteRow) registry.Route {
	return registry.Route{
		Host:          row.Host,
		Kind:          row.Kind,
		Version:       row.Version,
		Hibernate:     row.Hibernate,
		HomeRegion:    row.HomeRegion,
		Env:           row.Env,
		LivesAt:       row.LivesAt,
		Rev:           row.Rev,
		Provider:      row.Provider,
		ProviderState: row.ProviderState,
		HostedFor:     row.HostedFor,
	}
}

// RefusedError is a replicated row or tombstone this box does not take. Conflict marks
// one that conflicts with this box's own state or view (409); the others are malformed
// or outside this box's scope (400).
type RefusedError struct {
	Conflict bool
	Err      error
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

func refused(conflict bool, format string, args ...any) error {
	return &RefusedError{Conflict: conflict, Err: fmt.Errorf(format, args...)}
}

// ErrKept means a replicated row names this very box as where its live space lives:
// the row here (with the real upstream) is the original, and the peer's copy changes
// nothing. It is an answer, not a failure.
var ErrKept = errors.New("kept: the route lives on this box")

// AcceptRow decides whether this box stores a row a peer replicated to it, and in what
// form. prev is this box's row for the host, if any; check is this box's own test of a
// route it could serve (its kind configured, its env names allowed). The answer is the
// route to store, ErrKept, or a *RefusedError.
//
// The rules: the row must be in this box's scope (domains or region); a live row must
// name a live box of this mesh, since every request for the host would be forwarded
// there with a marker made with the mesh token, so never an arbitrary address (a
// metadata service, an internal host); a live route this box serves from a local
// upstream is never taken over by a peer.
func (b *Node) AcceptRow(row RouteRow, prev *registry.Route, check func(*registry.Route) error) (registry.Route, error) {
	if !row.InScopeFor(b.Domains, b.Region) {
		return registry.Route{}, refused(false, "route %s is outside this box's mesh domains and region", row.Host)
	}
	if row.LivesAt == b.Self {
		return registry.Route{}, ErrKept
	}
	if !row.Hibernate && !b.IsLiveMember(row.LivesAt) {
		return registry.Route{}, refused(true, "route %s: lives_at %s is not a live box of this mesh", row.Host, row.LivesAt)
	}
	rt := RouteFromRow(row)
	if err := check(&rt); err != nil {
		return registry.Route{}, &RefusedError{Err: err}
	}
	if servedHere(prev) {
		return registry.Route{}, refused(true, "route %s is a live route served by this box", rt.Host)
	}
	return rt, nil
}

// AcceptTombstone decides whether this box deletes its row for host when a peer says
// so. prev is this box's row, if any. Like a row, a tombstone outside this box's scope
// changes nothing: a host outside the mesh domains is this box's own business unless
// its stored row is homed in this box's region; and a live route served here stays.
func (b *Node) AcceptTombstone(host string, prev *registry.Route) error {
	if err := registry.ValidateHost(host); err != nil {
		return &RefusedError{Err: err}
	}
	if servedHere(prev) {
		return refused(true, "route %s is a live route served by this box", host)
	}
	homeRegion := ""
	if prev != nil {
		homeRegion = prev.HomeRegion
	}
	if !b.InScope(host, homeRegion) {
		return refused(false, "route %s is outside this box's mesh domains and region", host)
	}
	return nil
}

// servedHere reports whether rt is a live route this box serves from a local upstream.
func servedHere(rt *registry.Route) bool {
	return rt != nil && !rt.Hibernate && rt.LivesAt == ""
}

// Interface guards
var _ error = (*RefusedError)(nil)
