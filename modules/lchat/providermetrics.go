package lchat

import (
	"errors"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Metrics of the provider seam, per provider: requests forwarded to it and API calls
// made of it, those that got no answer (unreachable, timed out, cut at its bound), and
// their latency to the answer's end (an event stream's and an upgrade's to their
// headers).
var (
	providerRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lchat_provider_requests_total",
		Help: "Requests forwarded to, and API calls made of, each provider.",
	}, []string{"provider"})
	providerErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lchat_provider_errors_total",
		Help: "Requests to each provider that got no answer, or an answer cut at its bound.",
	}, []string{"provider"})
	providerSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lchat_provider_request_seconds",
		Help:    "Latency of requests to each provider.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"provider"})
)

// observeProvider counts one request to a provider (provider.Conn.Observe).
func observeProvider(name string, d time.Duration, failed bool) {
	providerRequests.WithLabelValues(name).Inc()
	if failed {
		providerErrors.WithLabelValues(name).Inc()
	}
	providerSeconds.WithLabelValues(name).Observe(d.Seconds())
}

// registerProviderMetrics registers the seam's metrics once; a reload finds them there.
func registerProviderMetrics(ctx caddy.Context, logger *zap.Logger) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{providerRequests, providerErrors, providerSeconds} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				logger.Warn("registering metrics", zap.Error(err))
			}
		}
	}
}
