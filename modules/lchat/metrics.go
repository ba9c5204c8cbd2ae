package lchat

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
)

// current is the app whose engine the metrics read; the newest config's app. Metrics
// read from the shared engine, so a reload does not reset them.
var current atomic.Pointer[App]

var (
	descRoutes = prometheus.NewDesc("lchat_routes", "Routes in this box's registry.", nil, nil)
	descSpaces = prometheus.NewDesc("lchat_spaces", "Spaces known to this box's engine, by state.", []string{"state"}, nil)
	descEngine = prometheus.NewDesc("lchat_engine_events_total", "Engine counters (wakes, sleeps, crashes, lease conflicts, syncs, ...).", []string{"counter"}, nil)
)

type collector struct{}

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRoutes
	ch <- descSpaces
	ch <- descEngine
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	a := current.Load()
	if a == nil || a.shared == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descRoutes, prometheus.GaugeValue, float64(a.shared.reg.Len()))
	byState := map[string]int{}
	for _, s := range statusOf(a.shared.eng) {
		byState[s.State]++
	}
	for state, n := range byState {
		ch <- prometheus.MustNewConstMetric(descSpaces, prometheus.GaugeValue, float64(n), state)
	}
	for name, v := range countersOf(a.shared.eng) {
		ch <- prometheus.MustNewConstMetric(descEngine, prometheus.CounterValue, v, name)
	}
}

// Histograms of the engine's wakes and checkpoints, fed by observeMetrics. They answer
// "why was that wake slow": which phase took the time.
var (
	wakePhaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lchat_wake_phase_seconds",
		Help:    "Duration of each phase of a wake: lease, restore, start, ready.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"phase"})
	wakeSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lchat_wake_seconds",
		Help:    "Duration of a whole wake (the sum of its phases), by result (ok, error).",
		Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"result"})
	checkpointSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lchat_checkpoint_seconds",
		Help:    "Duration of a checkpoint (snapshot, upload, manifest write), by result (ok, error).",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"result"})
	checkpointBytes = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lchat_checkpoint_bytes",
		Help:    "Bytes a successful checkpoint uploaded (new blobs only; unchanged files cost nothing).",
		Buckets: prometheus.ExponentialBuckets(1024, 4, 11), // 1 KiB .. 1 GiB
	})
)

// observeMetrics feeds the histograms from the engine's events.
func observeMetrics(ev engine.Event) {
	result := "ok"
	if ev.Err != "" {
		result = "error"
	}
	switch ev.Type {
	case engine.EventWake:
		for phase, d := range map[string]time.Duration{"lease": ev.Phases.Lease, "restore": ev.Phases.Restore,
			"fence": ev.Phases.Fence, "start": ev.Phases.Start, "ready": ev.Phases.Ready} {
			if d > 0 {
				wakePhaseSeconds.WithLabelValues(phase).Observe(d.Seconds())
			}
		}
		wakeSeconds.WithLabelValues(result).Observe(ev.Phases.Total().Seconds())
	case engine.EventCheckpoint:
		checkpointSeconds.WithLabelValues(result).Observe(ev.Duration.Seconds())
		if result == "ok" {
			checkpointBytes.Observe(float64(ev.Bytes))
		}
	}
}

// registerMetrics points the collector at a and registers it and the histograms once
// per metrics registry.
func registerMetrics(ctx caddy.Context, a *App) {
	current.Store(a)
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{collector{}, wakePhaseSeconds, wakeSeconds, checkpointSeconds, checkpointBytes} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				a.logger.Warn("registering metrics", zap.Error(err))
			}
		}
	}
}

// countersOf flattens the engine's counters into name → value, with snake_case names.
func countersOf(eng *engine.Engine) map[string]float64 {
	b, err := json.Marshal(eng.Counters())
	if err != nil {
		return nil
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil
	}
	out := make(map[string]float64, len(raw))
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			out[snakeCase(k)] = f
		}
	}
	return out
}

// snakeCase turns a Go field name (LeaseConflicts) into lease_conflicts; names that
// are already snake_case pass through.
func snakeCase(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			if i > 0 && !(s[i-1] >= 'A' && s[i-1] <= 'Z') {
				b = append(b, '_')
			}
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}
