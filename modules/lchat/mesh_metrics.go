package lchat

import "github.com/prometheus/client_golang/prometheus"

var (
	descMesh        = prometheus.NewDesc("lchat_mesh_events_total", "Mesh counters (forwards, forwarded_in, markers_stripped, fan-outs, rows and tombstones in, ...).", []string{"counter"}, nil)
	descMeshMembers = prometheus.NewDesc("lchat_mesh_live_members", "Live members in this box's view of the mesh.", nil, nil)
	descMeshFenced  = prometheus.NewDesc("lchat_mesh_fenced", "1 while this box is fenced (its heartbeat writes fail).", nil, nil)
	descMeshBucket  = prometheus.NewDesc("lchat_mesh_membership_total", "Membership work: heartbeat puts, lists, gets and their errors.", []string{"counter"}, nil)
	descMeshHBAge   = prometheus.NewDesc("lchat_mesh_heartbeat_age_seconds", "Time since this box's last successful heartbeat write was sent (by its own clock); it fences itself at dead_after minus fence_margin.", nil, nil)

	// The capacity metrics, on every box, with the mesh or without it (box.Capacity).
	descDesiredBoxes = prometheus.NewDesc("lchat_fleet_desired_boxes", "Boxes the fleet wants for its warm set: the fleet's warm set over the mean box budget, with headroom, and hysteresis before it drops below the boxes running (0: no box publishes a budget). The same on every box that made the same heartbeat listing.", nil, nil)
	descFleetWarm    = prometheus.NewDesc("lchat_fleet_warm_set_bytes", "The fleet's warm set: the sum of the live boxes' published warm sets.", nil, nil)
	descFleetBoxes   = prometheus.NewDesc("lchat_fleet_boxes", "Live boxes of the fleet that are not draining.", nil, nil)
	descBoxWarm      = prometheus.NewDesc("lchat_box_warm_set_bytes", "This box's warm set: the memory of its awake spaces (their cgroups', or their processes' resident memory) plus what the connections it holds cost, as last measured.", nil, nil)
	descBoxBudget    = prometheus.NewDesc("lchat_box_memory_budget_bytes", "This box's memory budget for spaces (mesh memory_budget, or its memory less a reserve).", nil, nil)
	descBoxMemRead   = prometheus.NewDesc("lchat_box_memory_read_seconds", "How long the last reading of the awake spaces' memory took (once per heartbeat).", nil, nil)
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
	for _, d := range []*prometheus.Desc{descDesiredBoxes, descFleetWarm, descFleetBoxes, descBoxWarm, descBoxBudget, descBoxMemRead} {
		ch <- d
	}
}

func (meshCollector) Collect(ch chan<- prometheus.Metric) {
	b := current.Load()
	if b == nil {
		return
	}
	c := b.Capacity()
	for d, v := range map[*prometheus.Desc]float64{
		descDesiredBoxes: float64(c.Fleet.Desired), descFleetWarm: float64(c.Fleet.WarmSet), descFleetBoxes: float64(c.Fleet.Boxes),
		descBoxWarm: float64(c.WarmSet), descBoxBudget: float64(c.Budget), descBoxMemRead: c.ReadTook.Seconds(),
	} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	if b.Mesh() == nil {
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
