package lchat

import "github.com/prometheus/client_golang/prometheus"

var (
	descMesh        = prometheus.NewDesc("lchat_mesh_events_total", "Mesh counters (forwards, forwarded_in, markers_stripped, fan-outs, rows and tombstones in, ...).", []string{"counter"}, nil)
	descMeshMembers = prometheus.NewDesc("lchat_mesh_live_members", "Live members in this box's view of the mesh.", nil, nil)
	descMeshFenced  = prometheus.NewDesc("lchat_mesh_fenced", "1 while this box is fenced (its heartbeat writes fail).", nil, nil)
	descMeshBucket  = prometheus.NewDesc("lchat_mesh_membership_total", "Membership work: heartbeat puts, lists, gets and their errors.", []string{"counter"}, nil)
	descMeshHBAge   = prometheus.NewDesc("lchat_mesh_heartbeat_age_seconds", "Time since this box's last successful heartbeat write was sent (by its own clock); it fences itself at dead_after minus fence_margin.", nil, nil)
)

// meshCollector reads the mesh of the current box; reloads keep the counters (they live
// in the box).
type meshCollector struct{}

func (meshCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descMesh
	ch <- descMeshMembers
	ch <- descMeshFenced
	ch <- descMeshBucket
	ch <- descMeshHBAge
}

func (meshCollector) Collect(ch chan<- prometheus.Metric) {
	b := current.Load()
	if b == nil || b.Mesh() == nil {
		return
	}
	ms, m := b.Mesh(), b.Mesh().Membership()
	for name, v := range ms.Counters() {
		ch <- prometheus.MustNewConstMetric(descMesh, prometheus.CounterValue, float64(v), name)
	}
	ch <- prometheus.MustNewConstMetric(descMeshMembers, prometheus.GaugeValue, float64(len(m.Live())))
	fenced := 0.0
	if m.Fenced() {
		fenced = 1
	}
	ch <- prometheus.MustNewConstMetric(descMeshFenced, prometheus.GaugeValue, fenced)
	ch <- prometheus.MustNewConstMetric(descMeshHBAge, prometheus.GaugeValue, m.Self().Age.Seconds())
	st := m.Stats()
	for name, v := range map[string]int64{
		"beats": st.Beats, "puts": st.Puts, "put_errors": st.PutErrors, "lists": st.Lists,
		"list_errors": st.ListErrors, "gets": st.Gets, "get_errors": st.GetErrors, "fences": st.Fences,
	} {
		ch <- prometheus.MustNewConstMetric(descMeshBucket, prometheus.CounterValue, float64(v), name)
	}
}

// Interface guards
var _ prometheus.Collector = meshCollector{}
