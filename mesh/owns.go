package mesh

import "github.com/lchat/lchat-caddy/registry"

// OwnsRoute reports whether this box owns host by its route (lookup is
// registry.Registry.Lookup): a host without a route is nobody's here; one with a route
// is this box's when it Owns the host in the route's home region. Scheduled wakes fire
// only on the owner.
func (b *Node) OwnsRoute(lookup func(host string) (*registry.Route, bool), host string) bool {
	rt, ok := lookup(host)
	return ok && b.Owns(host, rt.HomeRegion)
}
