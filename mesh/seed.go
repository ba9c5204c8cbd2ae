package mesh

import (
	"errors"
	"sort"
)

// PlanOptions scope a mesh-seed run.
type PlanOptions struct {
	// Domains are the mesh domains the seed covers (this box's LCHAT_MESH_DOMAINS).
	Domains []string
	// Region, when set (mesh-seed --region), adds every route whose home_region is it.
	Region string
	// Prune tombstones in-scope peer rows this registry no longer has.
	Prune bool
}

// ErrEmptySource is Plan's refusal to prune from a registry with zero in-scope rows: a
// misread registry must never mass-delete a peer.
var ErrEmptySource = errors.New("refusing to prune: this registry has zero in-scope routes (a misread registry must never mass-delete a peer)")

// Plan works out a mesh-seed pass: puts are the local rows in the seed's scope (every
// one, since a PUT is idempotent and the peer's listing need not carry env values), sorted
// by host (each with its revision: the peer keeps a newer row); with Prune, tombstones are
// the peer rows in the seed's scope that the local registry lacks, at their listed revision. Peer rows outside the seed's scope are never touched. Prune with
// zero in-scope local rows fails with ErrEmptySource and plans nothing.
func Plan(local, peer []RouteRow, opts PlanOptions) (puts []RouteRow, tombstones []Tombstone, err error) {
	have := make(map[string]bool, len(local))
	byHost := make(map[string]RouteRow, len(local))
	for _, r := range local {
		h := NormalizeHost(r.Host)
		have[h] = true
		r.Host = h
		if r.InScopeFor(opts.Domains, opts.Region) {
			byHost[h] = r
		}
	}
	if opts.Prune && len(byHost) == 0 {
		return nil, nil, ErrEmptySource
	}
	for _, r := range byHost {
		puts = append(puts, r)
	}
	sort.Slice(puts, func(i, j int) bool { return puts[i].Host < puts[j].Host })
	if !opts.Prune {
		return puts, nil, nil
	}
	gone := map[string]bool{}
	for _, r := range peer {
		h := NormalizeHost(r.Host)
		r.Host = h
		if r.InScopeFor(opts.Domains, opts.Region) && !have[h] && !gone[h] {
			gone[h] = true
			tombstones = append(tombstones, Tombstone{Host: h, Rev: r.Rev})
		}
	}
	sort.Slice(tombstones, func(i, j int) bool { return tombstones[i].Host < tombstones[j].Host })
	return puts, tombstones, nil
}

// Tombstone is one host mesh-seed --prune deletes on the peer, with the revision of the
// peer's row as listed: the peer deletes exactly that row, and keeps a newer one written
// meanwhile (registry.Registry.ApplyTombstone). Rev is empty for a peer that lists no
// revisions: an unconditional delete, as before.
type Tombstone struct {
	Host, Rev string
}
