package derpswitch

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lchat/lchat-caddy/derpswitch"
)

// current is the switcher the metrics read; the same engine survives reloads, so the
// counters stay monotonic.
var current atomic.Pointer[derpswitch.Switcher]

func setCurrent(sw *derpswitch.Switcher) { current.Store(sw) }

var metrics struct {
	once       sync.Once
	collectors []prometheus.Collector
}

func counterFunc(name, help string, get func(derpswitch.Counters) uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "lchat", Subsystem: "derp_switch", Name: name, Help: help,
	}, func() float64 {
		sw := current.Load()
		if sw == nil {
			return 0
		}
		return float64(get(sw.Counters()))
	})
}

func gaugeFunc(name, help string, get func(derpswitch.Status) float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "lchat", Subsystem: "derp_switch", Name: name, Help: help,
	}, func() float64 {
		sw := current.Load()
		if sw == nil {
			return 0
		}
		return get(sw.Status())
	})
}

// registerMetrics creates the collectors once and registers them with this config's
// registry (Caddy makes a registry per config load).
func registerMetrics(reg *prometheus.Registry) {
	metrics.once.Do(func() {
		metrics.collectors = []prometheus.Collector{
			counterFunc("pin_mbb_requests_total", "Pins issued as make-before-break switches.", func(c derpswitch.Counters) uint64 { return c.PinMBBRequests }),
			counterFunc("pin_mbb_commits_total", "Make-before-break switches that landed a pin.", func(c derpswitch.Counters) uint64 { return c.PinMBBCommits }),
			counterFunc("pin_mbb_retries_total", "Re-issues of a pin after a rollback.", func(c derpswitch.Counters) uint64 { return c.PinMBBRetries }),
			counterFunc("derp_reconnects_total", "Home connection teardowns and reconnects.", func(c derpswitch.Counters) uint64 { return c.DERPReconnects }),
			counterFunc("rehome_applied_total", "Direct (cold path or legacy) rehomes.", func(c derpswitch.Counters) uint64 { return c.RehomeApplied }),
			counterFunc("rollbacks_total", "Switches rolled back because the target was not proven.", func(c derpswitch.Counters) uint64 { return c.Rollbacks }),
			counterFunc("mbb_commits_total", "Make-before-break commits (any source).", func(c derpswitch.Counters) uint64 { return c.MBBCommits }),
			counterFunc("echo_replies_total", "Echo requests answered.", func(c derpswitch.Counters) uint64 { return c.EchoReplies }),
			gaugeFunc("home_region", "Region of the home connection.", func(s derpswitch.Status) float64 { return float64(s.HomeRegion) }),
			gaugeFunc("pin_pending", "1 while a pin is set but not yet the live home.", func(s derpswitch.Status) float64 {
				if s.PinPending {
					return 1
				}
				return 0
			}),
		}
	})
	for _, c := range metrics.collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
		}
	}
}
