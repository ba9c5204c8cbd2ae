package lchat

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/spacestore"
)

// scrape gathers reg's metrics by name, each a list of its samples.
func scrape(t *testing.T, reg *prometheus.Registry) map[string][]*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*dto.Metric{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetMetric()
	}
	return out
}

// The standby metrics of a mesh box: the spaces it stands by for and their bytes move
// with its spool's streams (a sealed one is no longer stood by for), its spaces' stream
// totals are there, and each takeover it notes lands in lchat_standby_takeover_seconds
// by result.
func TestStandbyMetricsMove(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	prev := current.Swap(b)
	t.Cleanup(func() { current.Store(prev) })
	defer b.Engine().Observe(observeMetrics)()
	reg := prometheus.NewRegistry()
	reg.MustRegister(meshCollector{}, takeoverSeconds)
	gauge := func(m map[string][]*dto.Metric, name string) float64 {
		t.Helper()
		if len(m[name]) != 1 {
			t.Fatalf("%s: %d samples, want 1", name, len(m[name]))
		}
		if g := m[name][0].GetGauge(); g != nil {
			return g.GetValue()
		}
		return m[name][0].GetCounter().GetValue()
	}
	takeovers := func(m map[string][]*dto.Metric) map[string]*dto.Histogram {
		out := map[string]*dto.Histogram{}
		for _, s := range m["lchat_standby_takeover_seconds"] {
			out[s.GetLabel()[0].GetValue()] = s.GetHistogram()
		}
		return out
	}

	m := scrape(t, reg)
	for _, name := range []string{"lchat_standby_spaces", "lchat_standby_streams_watched", "lchat_standby_bytes",
		"lchat_standby_segments_streamed_total", "lchat_standby_lost_total"} {
		if v := gauge(m, name); v != 0 {
			t.Fatalf("%s = %v before any stream", name, v)
		}
	}
	okBefore := takeovers(m)["ok"].GetSampleCount()

	claim := spacestore.Claim{Holder: boxtest.SelfB, Incarnation: "1", Lease: `"l"`, At: time.Now().UTC()}
	for _, host := range []string{"one.example.com", "two.example.com"} {
		for seq := int64(1); seq <= 2; seq++ {
			if err := b.Standby().Put(host, boxtest.StreamEntry(t, 1, seq, claim, 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := b.Standby().Seal("two.example.com", 1, claim); err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, f := range b.StandbyFor() {
		bytes += f.Bytes
	}
	m = scrape(t, reg)
	if got := gauge(m, "lchat_standby_spaces"); got != 1 {
		t.Fatalf("lchat_standby_spaces = %v, want 1 (one stream kept, one sealed by a takeover)", got)
	}
	if got := gauge(m, "lchat_standby_bytes"); bytes == 0 || got != float64(bytes) {
		t.Fatalf("lchat_standby_bytes = %v, want the spool's %d", got, bytes)
	}

	b.NoteTakeover("two.example.com", boxtest.SelfB, "its address refuses connections", 700*time.Millisecond, nil)
	b.NoteTakeover("three.example.com", boxtest.SelfB, "restarted", 3*time.Second, errors.New("reading the log: boom"))
	h := takeovers(scrape(t, reg))
	if h["ok"].GetSampleCount() != okBefore+1 || h["error"].GetSampleCount() < 1 || h["ok"].GetSampleSum() < 0.7 {
		t.Fatalf("lchat_standby_takeover_seconds: ok %+v error %+v, want one more ok of 0.7 s and an error", h["ok"], h["error"])
	}
}
