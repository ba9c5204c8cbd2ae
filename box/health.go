package box

import "github.com/lchat/lchat-caddy/lifecycle"

// Health is what a load balancer's health check asks of the box: its lifecycle state, and
// whether the balancer should send it new connections. Only a serving box should: one
// starting has not written its first heartbeat (it serves no space yet), a fenced one
// cannot write the bucket (peers may take its spaces over at any moment), and a draining
// one is going away (from the drain's first step, so the balancer takes it out while its
// listener is still open: Caddy's shutdown_delay keeps it open that long).
func (b *Box) Health() (lifecycle.State, bool) {
	s := b.life.State()
	return s, s == lifecycle.Serving
}
