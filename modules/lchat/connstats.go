package lchat

import "github.com/lchat/lchat-caddy/fleetview"

// spaceConns is the held connections by space, for the box's status and the console.
func (c *conns) spaceConns() map[string]fleetview.Conns {
	st := c.hub.SpaceStats()
	out := make(map[string]fleetview.Conns, len(st))
	for host, s := range st {
		out[host] = fleetview.Conns{Open: s.Open, Parked: s.Parked, PendingBytes: s.PendingBytes}
	}
	return out
}
