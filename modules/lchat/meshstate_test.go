package lchat

import "github.com/lchat/lchat-caddy/mesh"

// withBox completes a meshState built by a test: the mesh.Box over its membership (no
// live members without one) and the replicator.
func withBox(ms *meshState) *meshState {
	live := func() []mesh.Member { return nil }
	var draining func() bool
	if ms.m != nil {
		live, draining = ms.m.Live, ms.m.Draining
	}
	ms.box = &mesh.Box{Self: ms.cfg.Self, Domains: ms.cfg.Domains, Region: ms.cfg.Region, Live: live, IsDraining: draining, Holders: new(mesh.Holders)}
	ms.repl = &mesh.Replicator{Box: ms.box, Client: ms.client, Ctx: ms.ctx}
	return ms
}
