package mesh

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Relocation refusals and failures, by what the operator does about them. Test with
// errors.Is; the message says what was (not) changed.
var (
	// ErrRelocateInvalid: the request is malformed (400).
	ErrRelocateInvalid = errors.New("invalid relocation")
	// ErrRelocateNotFound: no route for the host (404).
	ErrRelocateNotFound = errors.New("no such route")
	// ErrRelocateRefused: the space or the fleet is not in a state to relocate it now
	// (409): awake, live-pinned, no destination box, no DNS provider.
	ErrRelocateRefused = errors.New("relocation refused")
	// ErrRelocateUpstream: a store or DNS provider failed (502).
	ErrRelocateUpstream = errors.New("relocation failed upstream")
)

func relocErr(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %w", kind, errors.New(fmt.Sprintf(format, args...)))
}

// RelocateErrorMessage is err's message without the category prefix, for an operator.
func RelocateErrorMessage(err error) string {
	msg := err.Error()
	for _, kind := range []error{ErrRelocateInvalid, ErrRelocateNotFound, ErrRelocateRefused, ErrRelocateUpstream} {
		if errors.Is(err, kind) {
			return strings.TrimPrefix(msg, kind.Error()+": ")
		}
	}
	return msg
}

// RelocateRequest asks to move a hibernating space's home to another region.
type RelocateRequest struct {
	Host string
	// To is the destination region.
	To string
	// MoveDNS also points the host's A (or AAAA) record at a live box of To.
	MoveDNS bool
}

// RelocateResult is what a relocation did.
type RelocateResult struct {
	Host   string   `json:"host"`
	From   string   `json:"from"`
	To     string   `json:"to"`
	Store  string   `json:"store"`
	Fanout []string `json:"fanout"`
	// Copy is set when the space was copied to the destination region's bucket.
	Copy    *spacestore.CopyResult `json:"copy,omitempty"`
	DNS     string                 `json:"dns,omitempty"`
	Already bool                   `json:"already,omitempty"`
}

// RelocateRoutes is the registry as a relocation uses it.
type RelocateRoutes interface {
	Get(host string) (registry.Route, error)
	Update(host string, fn func(*registry.Route) error) (registry.Route, error)
}

// DNSSetter points a host's address record at ip, and describes what it did.
type DNSSetter interface {
	SetAddress(ctx context.Context, host string, ip netip.Addr) (string, error)
}

// Relocator moves hibernating spaces between regions for this box.
type Relocator struct {
	Node *Node
	// Bucket is this box's bucket.
	Bucket bucket.Bucket
	// RegionBuckets are the buckets of other regions, by region (mesh.region_buckets).
	RegionBuckets map[string]bucket.Bucket
	// DeadAfter and OpTimeout read another bucket's heartbeats like the membership.
	DeadAfter, OpTimeout time.Duration
	Routes               RelocateRoutes
	// AwakeHere reports whether the space is awake (or waking) on this box.
	AwakeHere func(host string) bool
	// HolderLive is the lease rule for this box's bucket (Membership.HolderLive).
	HolderLive spacestore.LiveFunc
	// Replicator fans the changed row out.
	Replicator *Replicator
	// DNS is the provider for MoveDNS; nil when none is configured.
	DNS DNSSetter
}

// RelocatePlan is what a relocation will do, decided before anything changes.
type RelocatePlan struct {
	// PerRegion is set when the destination keeps spaces in another bucket, so the
	// space is copied there.
	PerRegion bool
	// Dest is the destination's bucket (this box's when not PerRegion).
	Dest bucket.Bucket
	// Members are the live boxes the relocation fans out among: this box's view,
	// plus the destination bucket's heartbeats when PerRegion.
	Members []Member
	// DestBoxes are the live, not draining boxes of the destination region.
	DestBoxes []Member
	// DestLive is the lease rule for the destination bucket.
	DestLive spacestore.LiveFunc
	// DNSIP and DNSBox are the record's target and the box advertising it (MoveDNS).
	DNSIP  netip.Addr
	DNSBox string
}

// Plan checks a relocation and decides it, changing nothing. Everything that can refuse
// refuses here: a malformed request, a missing or live-pinned route, a space awake on
// this box or on any live box (the lease in this box's bucket says which; the copy
// checks the destination's), a destination whose boxes keep spaces in another bucket
// than the one configured, MoveDNS without a provider or without a live destination box
// advertising an address.
func (r *Relocator) Plan(ctx context.Context, req RelocateRequest) (registry.Route, RelocatePlan, error) {
	var plan RelocatePlan
	if err := registry.ValidateHost(req.Host); err != nil {
		return registry.Route{}, plan, relocErr(ErrRelocateInvalid, "%v", err)
	}
	if req.To == "" {
		return registry.Route{}, plan, relocErr(ErrRelocateInvalid, `body must set "to": the destination region`)
	}
	if err := registry.ValidateRegion(req.To); err != nil {
		return registry.Route{}, plan, relocErr(ErrRelocateInvalid, "to: %v", err)
	}
	host := req.Host
	cur, err := r.Routes.Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return cur, plan, relocErr(ErrRelocateNotFound, "no route for host %s", host)
	}
	if err != nil {
		return cur, plan, err
	}
	if !cur.Hibernate {
		return cur, plan, relocErr(ErrRelocateRefused, "%s is a live route pinned to its box; only hibernating spaces relocate (turn hibernation on first)", host)
	}
	if err := r.checkAsleep(ctx, host); err != nil {
		return cur, plan, err
	}

	own := r.Bucket
	plan.Dest, plan.PerRegion = r.RegionBuckets[req.To]
	if plan.PerRegion && SameBucket(plan.Dest.String(), own.String()) {
		plan.PerRegion = false
	}
	plan.Members = r.Node.Live()
	plan.DestLive = r.HolderLive
	if plan.PerRegion {
		// The destination region's live boxes beat in the destination bucket.
		others, err := ReadMembers(ctx, plan.Dest, r.DeadAfter, r.OpTimeout)
		if err != nil {
			return cur, plan, relocErr(ErrRelocateUpstream, "destination bucket: %v; nothing was changed", err)
		}
		plan.DestLive = LiveIn(others)
		plan.Members = others
	} else {
		plan.Dest = own
	}
	for _, m := range plan.Members {
		if m.Region == req.To && !m.Draining {
			plan.DestBoxes = append(plan.DestBoxes, m)
		}
	}
	for _, m := range plan.DestBoxes {
		switch {
		case m.Bucket == "":
		case !plan.PerRegion && !SameBucket(m.Bucket, own.String()):
			return cur, plan, relocErr(ErrRelocateRefused, "%s boxes keep spaces in bucket %s, not this box's %s: configure mesh.region_buckets for %s to copy the space there; nothing was changed",
				req.To, m.Bucket, own.String(), req.To)
		case plan.PerRegion && !SameBucket(m.Bucket, plan.Dest.String()):
			return cur, plan, relocErr(ErrRelocateRefused, "%s boxes keep spaces in bucket %s, but mesh.region_buckets names %s for %s; nothing was changed",
				req.To, m.Bucket, plan.Dest.String(), req.To)
		}
	}
	if req.MoveDNS {
		if r.DNS == nil {
			return cur, plan, relocErr(ErrRelocateRefused, "--move-dns: no DNS provider is configured for relocation on this box (mesh.relocate_dns); nothing was changed")
		}
		candidates := plan.DestBoxes
		if owner, ok := Owner(host, plan.DestBoxes, req.To); ok {
			// The box the mesh will place the space on first, then the others.
			candidates = append([]Member{owner}, plan.DestBoxes...)
		}
		for _, m := range candidates {
			if ip, err := netip.ParseAddr(m.Address); err == nil {
				plan.DNSIP, plan.DNSBox = ip, m.Self
				break
			}
		}
		if !plan.DNSIP.IsValid() {
			return cur, plan, relocErr(ErrRelocateRefused, "--move-dns: no live box of region %s advertises a public address (mesh.public_address); nothing was changed", req.To)
		}
	}
	return cur, plan, nil
}

// checkAsleep refuses a space awake anywhere, alike on this box and on a peer, naming
// the box: this box's engine state first (a wake in progress has no lease yet), then the
// lease in this box's bucket.
func (r *Relocator) checkAsleep(ctx context.Context, host string) error {
	if r.AwakeHere != nil && r.AwakeHere(host) {
		return relocErr(ErrRelocateRefused, "%s is awake on %s (this box); relocate it while it sleeps; nothing was changed", host, r.Node.Self)
	}
	err := spacestore.CheckAsleep(ctx, r.Bucket, host, r.HolderLive)
	var awake *spacestore.AwakeError
	switch {
	case errors.As(err, &awake):
		where := awake.Holder
		if where == r.Node.Self {
			where += " (this box)"
		}
		return relocErr(ErrRelocateRefused, "%s is awake on %s; relocate it while it sleeps; nothing was changed", host, where)
	case err != nil:
		return relocErr(ErrRelocateUpstream, "%s: %v; nothing was changed", host, err)
	}
	return nil
}

// Relocate moves a hibernating space to another region: Plan, then the store copy
// (per-region buckets only), the home_region flip with a re-fan-out to the union of the
// old and new targets, and the DNS record, in that order, so a re-run after a failure
// finishes the job.
func (r *Relocator) Relocate(ctx context.Context, req RelocateRequest) (RelocateResult, error) {
	cur, plan, err := r.Plan(ctx, req)
	if err != nil {
		return RelocateResult{}, err
	}
	host, own := req.Host, r.Bucket
	res := RelocateResult{Host: host, From: cur.HomeRegion, To: req.To,
		Store: "no copy: source and destination share the bucket " + own.String()}
	if plan.PerRegion {
		cp, err := spacestore.CopySpace(ctx, own, plan.Dest, host, r.HolderLive, plan.DestLive)
		if errors.Is(err, spacestore.ErrSpaceAwake) {
			return res, relocErr(ErrRelocateRefused, "%s: %v; home_region was not changed", host, err)
		}
		if err != nil {
			return res, relocErr(ErrRelocateUpstream, "copying %s to %s: %v; home_region was not changed", host, plan.Dest.String(), err)
		}
		res.Copy = &cp
		switch {
		case cp.Skipped:
			res.Store = fmt.Sprintf("no copy: %s already holds generation %d (source: %d or older)", plan.Dest.String(), cp.DestGeneration, cp.DestGeneration)
		case cp.Generation == 0:
			res.Store = "no copy: the space has no checkpoint in " + own.String()
		default:
			res.Store = fmt.Sprintf("copied generation %d from %s to %s: %d blobs, %d bytes (lease not copied)",
				cp.Generation, own.String(), plan.Dest.String(), cp.Blobs, cp.Bytes)
		}
	}
	stored := cur
	if cur.HomeRegion == req.To {
		res.Already = true
	} else {
		stored, err = r.Routes.Update(host, func(rt *registry.Route) error {
			rt.HomeRegion = req.To
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	members := r.Node.Live()
	if plan.PerRegion {
		members = append(members, plan.Members...)
	}
	targets := RelocateTargets(host, cur.HomeRegion, req.To, members, r.Node.Self)
	for _, t := range targets {
		res.Fanout = append(res.Fanout, t.Self)
	}
	if r.Replicator != nil {
		r.Replicator.PutTo(stored, targets)
	}
	if req.MoveDNS {
		done, err := r.DNS.SetAddress(ctx, host, plan.DNSIP)
		if err != nil {
			return res, relocErr(ErrRelocateUpstream, "relocated %s to %s (store and home_region done), but the DNS record was not changed: %v; re-run with --move-dns", host, req.To, err)
		}
		res.DNS = done + " (" + plan.DNSBox + ")"
	}
	return res, nil
}

// RelocateTargets is the union of a row's fan-out targets homed in from and in to,
// sorted by Self: the old region's boxes learn the new placement, the new region's
// boxes get the row.
func RelocateTargets(host, from, to string, members []Member, self string) []Member {
	seen := map[string]bool{}
	var out []Member
	for _, t := range append(Targets(host, from, members, self), Targets(host, to, members, self)...) {
		if !seen[t.Self] {
			seen[t.Self] = true
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Self < out[j].Self })
	return out
}

// SameBucket reports whether two bucket descriptions (String(), as advertised in
// heartbeats) name the same store. A description carries the endpoint only when it was
// configured explicitly ("s3://b/p at http://host:port"), not when it came from
// AWS_ENDPOINT_URL_S3, so the endpoints are compared only when both carry one.
func SameBucket(a, b string) bool {
	abase, aend, _ := strings.Cut(a, " at ")
	bbase, bend, _ := strings.Cut(b, " at ")
	return abase == bbase && (aend == "" || bend == "" || aend == bend)
}

// ElsewhereBucket names the bucket that keeps the spaces homed in region when it is not
// own (this box's bucket, its String()): the one mesh.region_buckets configures for
// region, else one that a live box of region (members: this box's view) advertises.
// Empty: own keeps them, as far as this box can tell (no region, this box's region
// selfRegion, or nothing says otherwise). A move that reads or writes a space's state in
// own (a delegation to a provider, a reclaim) refuses a space kept elsewhere, as a
// relocation's Plan refuses a destination whose boxes keep spaces in another bucket.
func ElsewhereBucket(region, selfRegion, own string, regionBuckets map[string]bucket.Bucket, members []Member) string {
	if region == "" || region == selfRegion {
		return ""
	}
	if b, ok := regionBuckets[region]; ok && b != nil && !SameBucket(b.String(), own) {
		return b.String()
	}
	for _, m := range members {
		if m.Region == region && m.Bucket != "" && !SameBucket(m.Bucket, own) {
			return m.Bucket
		}
	}
	return ""
}
