package mesh

import (
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

// FiresWakeRoute reports whether this box fires host's due scheduled wake, late past its
// time, by its route (lookup is registry.Registry.Lookup): a host without a route is
// nobody's here; one with a route is fired where FiresWake says, in the route's home
// region.
func (b *Node) FiresWakeRoute(lookup func(host string) (*registry.Route, bool), host string, late time.Duration) bool {
	rt, ok := lookup(host)
	return ok && b.FiresWake(host, rt.HomeRegion, late)
}
