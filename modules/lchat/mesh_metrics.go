package lchat

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lchat/lchat-caddy/box"
)

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

	// The warm standbys (durability standby), with the mesh: this box as a standby (its
	// spool) and as a holder (its spaces' streams). Takeovers are lchat_standby_takeover_seconds.
	descStandbySpaces   = prometheus.NewDesc("lchat_standby_spaces", "Spaces this box stands by for: streams its spool keeps that no takeover sealed.", nil, nil)
	descStandbyWatched  = prometheus.NewDesc("lchat_standby_streams_watched", "Streams whose holder this box watches now: a holder found dead is taken over at once; the spaces of one not watched wait for its heartbeat to die.", nil, nil)
	descStandbyBytes    = prometheus.NewDesc("lchat_standby_bytes", "Bytes of the streams this box's spool keeps.", nil, nil)
	descStandbyStreamed = prometheus.NewDesc("lchat_standby_segments_streamed_total", "Segments of this box's spaces' streams that their standbys took (on their disks).", nil, nil)
	descStandbyLost     = prometheus.NewDesc("lchat_standby_lost_total", "Standbys this box's spaces gave up: their answers then waited for the bucket log until a new stream.", nil, nil)
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
	for _, d := range []*prometheus.Desc{descDesiredBoxes, descFleetWarm, descFleetBoxes, descBoxWarm, descBoxBudget, descBoxMemRead,
		descStandbySpaces, descStandbyWatched, descStandbyBytes, descStandbyStreamed, descStandbyLost} {
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
	collectStandby(ch, b)
}

// collectStandby reports b's standbys: the streams its spool keeps and its spaces' totals.
func collectStandby(ch chan<- prometheus.Metric, b *box.Box) {
	var spaces, watched, bytes float64
	for _, f := range b.StandbyFor() {
		if !f.Sealed {
			spaces++
		}
		if f.Watching {
			watched++
		}
		bytes += float64(f.Bytes)
	}
	ch <- prometheus.MustNewConstMetric(descStandbySpaces, prometheus.GaugeValue, spaces)
	ch <- prometheus.MustNewConstMetric(descStandbyWatched, prometheus.GaugeValue, watched)
	ch <- prometheus.MustNewConstMetric(descStandbyBytes, prometheus.GaugeValue, bytes)
	t := b.StandbyTotals()
	ch <- prometheus.MustNewConstMetric(descStandbyStreamed, prometheus.CounterValue, float64(t.Streamed))
	ch <- prometheus.MustNewConstMetric(descStandbyLost, prometheus.CounterValue, float64(t.Lost))
}

// Interface guards
var _ prometheus.Collector = meshCollector{}
