package derpswitch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
	"tailscale.com/tailcfg"
)

// latencyPings is how many ping/pong round trips measure one region; the best counts.
const latencyPings = 3

// measureDERPLatency is the default latency source for autonegotiation. It measures
// each region by DERP ping/pong round trips, the latency of the DERP protocol itself
// (TLS and the relay's processing included), never a TCP connect: over the live
// connection to that region when the switcher has one (the home, an aux or a draining
// old home), else over a short-lived auxiliary probe connection (Config.ProbeDial)
// whose connect is not timed. A region's latency is the best of its round trips; an
// unreachable region is missing from the result.
func (s *Switcher) measureDERPLatency(ctx context.Context, m *tailcfg.DERPMap) map[int]time.Duration {
	live := map[int]Conn{}
	s.stMu.Lock()
	for _, sl := range s.slots {
		if sl.connected.Load() && !sl.closed.Load() {
			if _, ok := live[sl.region]; !ok || sl == s.homePtr.Load() {
				live[sl.region] = sl.conn
			}
		}
	}
	s.stMu.Unlock()
	probeDial := s.config().ProbeDial
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[int]time.Duration{}
	for id := range m.Regions {
		safego.Go(&wg, s.logger(), "latency probe", func() {
			c := live[id]
			if c == nil {
				probe, stop, err := s.openProbe(ctx, probeDial, s.regionFunc(id))
				if err != nil {
					return
				}
				defer stop()
				c = probe
			}
			if d, ok := bestPing(ctx, c); ok {
				mu.Lock()
				out[id] = d
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// openProbe connects a probe connection and runs its receive loop (pongs arrive
// through it) until stop.
func (s *Switcher) openProbe(ctx context.Context, dial DialFunc, region func() *tailcfg.DERPRegion) (Conn, func(), error) {
	c := dial(region)
	if err := c.Connect(ctx); err != nil {
		c.Close()
		return nil, nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		safego.Run(s.logger(), "probe recv loop", func() {
			for pctx.Err() == nil {
				if _, _, err := c.RecvDetail(); err != nil {
					return
				}
			}
		})
	}()
	return c, func() { cancel(); c.Close(); <-done }, nil
}

// bestPing returns the best of latencyPings round trips on c.
func bestPing(ctx context.Context, c Conn) (time.Duration, bool) {
	var best time.Duration
	ok := false
	for i := 0; i < latencyPings; i++ {
		start := time.Now()
		err := c.Ping(ctx)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			continue
		}
		if d := time.Since(start); !ok || d < best {
			best, ok = d, true
		}
	}
	return best, ok
}
