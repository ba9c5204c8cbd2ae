package lchat

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/held"
)

// current is the box the metrics read: the running config's, set when a config starts
// (App.Start) and put back when that start is unwound (App.Stop). Metrics read from the
// box, which outlives reloads, so a reload does not reset them.
var current atomic.Pointer[box.Box]

var (
	descRoutes = prometheus.NewDesc("lchat_routes", "Routes in this box's registry.", nil, nil)
	descSpaces = prometheus.NewDesc("lchat_spaces", "Spaces known to this box's engine, by state.", []string{"state"}, nil)
	descEngine = prometheus.NewDesc("lchat_engine_events_total", "Engine counters (wakes, sleeps, crashes, lease conflicts, syncs, ...).", []string{"counter"}, nil)
	descLog    = prometheus.NewDesc("lchat_log", "The logs of the awake spaces of durability bucket: segments and bytes landed, segments folded by checkpoints, bytes cut and not yet landed, answers waiting at their gates, answers refused (503), the longest durable lag and wait p99 in seconds.", []string{"figure"}, nil)
)

// Held connections (connhold: WebSockets and event streams), read from the hub of the current box.
var (
	descConns      = prometheus.NewDesc("lchat_conns", "Held connections: open WebSockets (socket up), parked (no goroutine, in the epoll set), readers (reader goroutines running), streams (resumable event streams held).", []string{"state"}, nil)
	descConnBytes  = prometheus.NewDesc("lchat_conn_bytes", "Bytes held for connections: pending (client messages kept for instances), out (queued to clients).", []string{"kind"}, nil)
	descConnEvents = prometheus.NewDesc("lchat_conn_events_total", "Held connections' counters: pings and auto_responses answered by the box, delivered and redelivered events, delivery_errors, overflows (1013).", []string{"counter"}, nil)
	descConnCloses = prometheus.NewDesc("lchat_conn_closes_total", "Close frames the box sent, by code.", []string{"code"}, nil)
)

// connsOf maps a box to its held connections (set when the pool opens the box).
var connsOf sync.Map // *box.Box -> *held.Conns

type collector struct{}

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRoutes
	ch <- descSpaces
	ch <- descEngine
	ch <- descLog
	ch <- descConns
	ch <- descConnBytes
	ch <- descConnEvents
	ch <- descConnCloses
}

// collectConns reports b's held connections, if it holds any.
func collectConns(ch chan<- prometheus.Metric, b *box.Box) {
	v, ok := connsOf.Load(b)
	if !ok {
		return
	}
	st := v.(*held.Conns).Stats()
	gauge := func(d *prometheus.Desc, v float64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, label)
	}
	gauge(descConns, float64(st.Held), "open")
	gauge(descConns, float64(st.Parked), "parked")
	gauge(descConns, float64(st.Readers), "readers")
	gauge(descConns, float64(st.Streams), "streams")
	gauge(descConnBytes, float64(st.PendingBytes), "pending")
	gauge(descConnBytes, float64(st.OutBytes), "out")
	for name, n := range map[string]uint64{"pings": st.Pings, "auto_responses": st.AutoResponses, "delivered": st.Delivered,
		"redelivered": st.Redelivered, "delivery_errors": st.DeliveryErrors, "overflows": st.Overflows} {
		ch <- prometheus.MustNewConstMetric(descConnEvents, prometheus.CounterValue, float64(n), name)
	}
	for code, n := range st.Closes {
		ch <- prometheus.MustNewConstMetric(descConnCloses, prometheus.CounterValue, float64(n), strconv.Itoa(code))
	}
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	b := current.Load()
	if b == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descRoutes, prometheus.GaugeValue, float64(b.Registry().Len()))
	byState := map[engine.State]int{}
	logs := map[string]float64{"segments": 0, "bytes": 0, "folded": 0, "unproven_bytes": 0, "waiting": 0, "failed": 0, "lag_seconds": 0, "wait_p99_seconds": 0}
	for _, s := range b.Spaces() {
		byState[s.State]++
		if l := s.Log; l != nil {
			logs["segments"] += float64(l.Segments)
			logs["bytes"] += float64(l.Bytes)
			logs["folded"] += float64(l.Folded)
			logs["unproven_bytes"] += float64(l.Unproven)
			logs["waiting"] += float64(l.Waiting)
			logs["failed"] += float64(l.Failed)
			logs["lag_seconds"] = max(logs["lag_seconds"], l.Lag.Seconds())
			logs["wait_p99_seconds"] = max(logs["wait_p99_seconds"], l.WaitP99.Seconds())
		}
	}
	for name, v := range logs {
		ch <- prometheus.MustNewConstMetric(descLog, prometheus.GaugeValue, v, name)
	}
	for state, n := range byState {
		ch <- prometheus.MustNewConstMetric(descSpaces, prometheus.GaugeValue, float64(n), string(state))
	}
	for name, v := range box.EngineCounters(b.Engine().Counters()) {
		ch <- prometheus.MustNewConstMetric(descEngine, prometheus.CounterValue, float64(v), name)
	}
	collectConns(ch, b)
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
	takeoverSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lchat_standby_takeover_seconds",
		Help:    "Duration of a takeover by this box of a space whose holder was found dead before its heartbeat said so (durability standby), from the verdict to the space awake here, by result (ok, error). Its count is the failovers this box took.",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60},
	}, []string{"result"})
	checkpointBytes = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lchat_checkpoint_bytes",
		Help:    "Bytes a successful checkpoint uploaded (new blobs only; unchanged files cost nothing).",
		Buckets: prometheus.ExponentialBuckets(1024, 4, 11), // 1 KiB .. 1 GiB
	})
)

// observeMetrics feeds the histograms from the engine's events (a takeover's are the
// box's: box.Box.NoteTakeover).
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
	case engine.EventTakeover:
		takeoverSeconds.WithLabelValues(result).Observe(ev.Duration.Seconds())
	case engine.EventCheckpoint:
		checkpointSeconds.WithLabelValues(result).Observe(ev.Duration.Seconds())
		if result == "ok" {
			checkpointBytes.Observe(float64(ev.Bytes))
		}
	}
}

// registerMetrics registers the collectors and the histograms once per metrics registry.
func registerMetrics(ctx caddy.Context, a *App) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{collector{}, meshCollector{}, wakePhaseSeconds, wakeSeconds, checkpointSeconds, checkpointBytes, takeoverSeconds} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				a.logger.Warn("registering metrics", zap.Error(err))
			}
		}
	}
}
