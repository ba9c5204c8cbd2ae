package fleetview

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of what a Recorder keeps: enough for an operator's "what just happened" and the
// last couple of hours of charts, a few hundred kilobytes at most.
const (
	maxEvents     = 500
	maxSamples    = 240 // 2h at the default 30s interval
	maxAwakePts   = 1000
	wakesPerHost  = 5
	maxWakeHosts  = 2000
	subscriberBuf = 64
)

// LatencyBounds are the upper bounds of the wake-latency histogram's buckets; a last
// bucket holds the slower wakes.
var LatencyBounds = []time.Duration{
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
}

// Wake is one wake of a space, by phase.
type Wake struct {
	At     time.Time `json:"at"`
	Phases Phases    `json:"phases"`
	Err    string    `json:"error,omitempty"`
}

// Sample is one point of the charts.
type Sample struct {
	At time.Time `json:"at"`
	// RequestsPerMin and BucketPerMin are rates over the interval before At.
	RequestsPerMin float64 `json:"requests_per_min"`
	BucketPerMin   float64 `json:"bucket_requests_per_min"`
	Awake          int     `json:"awake"`
	Held           int     `json:"held"` // connections held by this box: WebSockets and event streams
	DERPHome       int     `json:"derp_home,omitempty"`
}

// Point is one value at one time.
type Point struct {
	At    time.Time `json:"at"`
	Value float64   `json:"value"`
}

// LatencyBucket is one bar of the wake-latency histogram.
type LatencyBucket struct {
	Le    time.Duration `json:"le"` // 0: slower than every bound
	Label string        `json:"label"`
	Count uint64        `json:"count"`
}

// Charts is everything the console's charts draw.
type Charts struct {
	WakeLatency []LatencyBucket `json:"wake_latency"`
	Samples     []Sample        `json:"samples"`
	// Awake is the number of awake spaces at every sample and after every wake or sleep,
	// so a space that was awake between two samples still shows.
	Awake        []Point `json:"awake"`
	DERPSwitches []Event `json:"derp_switches"`
	DERP         bool    `json:"derp"` // the DERP app is configured
}

// Recorder keeps the recent events, each space's last wakes, the wake-latency histogram
// and periodic samples of a Source, and fans events out to live subscribers (the console's
// SSE streams). It derives the events no single call reports (a box joining, going
// missing, draining; replication; a DERP home change) by comparing consecutive samples.
// Its methods are safe for concurrent use.
type Recorder struct {
	src  Source
	derp DERPSource // nil without the DERP app

	mu       sync.Mutex
	seq      uint64
	events   []Event // ring of the last maxEvents, oldest first
	wakes    map[string][]Wake
	wakeLRU  []string // hosts in wakes, oldest first
	latency  []uint64 // len(LatencyBounds)+1
	samples  []Sample
	awake    []Point
	poke     chan struct{} // a wake or sleep happened: take an awake point
	switches []Event
	prev     *sampled // the previous Sample's readings; nil before the first
	subs     map[chan Event]struct{}

	fleetMu  sync.Mutex // serializes fleet reads through Fleet, so a burst shares one
	fleet    Fleet
	fleetAt  time.Time
	fleetErr error
	// fleetStale is set by a local wake or sleep, so the next page shows it at once.
	fleetStale atomic.Bool
}

// Fleet reads the source's fleet, or returns the last read when it is younger than
// maxAge: pages and the fragments a burst of events refreshes share one read of every
// peer's status instead of one each.
func (r *Recorder) Fleet(ctx context.Context, maxAge time.Duration) (Fleet, error) {
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	if !r.fleetStale.Swap(false) && !r.fleetAt.IsZero() && time.Since(r.fleetAt) < maxAge {
		return r.fleet, r.fleetErr
	}
	r.fleet, r.fleetErr = r.src.Fleet(ctx)
	r.fleetAt = time.Now()
	return r.fleet, r.fleetErr
}

// sampled is what one Sample read, kept to diff against the next.
type sampled struct {
	at    time.Time
	stats Stats
	boxes map[string]Box
	derp  DERP
	fleet bool
}

// NewRecorder returns a recorder of src (and of derp, which may be nil). Call Run to
// sample, and Record (or src.Subscribe(r.Record)) to feed it events.
func NewRecorder(src Source, derp DERPSource) *Recorder {
	return &Recorder{
		src:     src,
		derp:    derp,
		wakes:   map[string][]Wake{},
		latency: make([]uint64, len(LatencyBounds)+1),
		subs:    map[chan Event]struct{}{},
		poke:    make(chan struct{}, 1),
	}
}

// Run subscribes to the source's events and samples it every interval until ctx ends.
func (r *Recorder) Run(ctx context.Context, interval time.Duration) {
	cancel := r.src.Subscribe(r.Record)
	defer cancel()
	r.Sample(ctx, time.Now())
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.Sample(ctx, now)
		case <-r.poke:
			r.addAwake(time.Now(), r.src.Stats().Awake)
		}
	}
}

// Record stamps ev with a sequence number (and a time when it has none), keeps it, and
// hands it to every subscriber that keeps up; a subscriber whose buffer is full misses it
// (its stream resumes from Since on reconnect).
func (r *Recorder) Record(ev Event) {
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	ev.Seq = r.seq
	r.events = trimmed(append(r.events, ev), maxEvents)
	if ev.Type == EventWake && ev.Host != "" && ev.Phases != nil {
		r.recordWakeLocked(ev)
	}
	switch ev.Type {
	case EventWake, EventSleep, EventCrash, EventFence:
		if ev.Box == "" { // this box's own engine
			r.fleetStale.Store(true)
		}
		select {
		case r.poke <- struct{}{}:
		default:
		}
	}
	if ev.Type == EventDERPSwitch {
		r.switches = trimmed(append(r.switches, ev), maxEvents)
	}
	for ch := range r.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// trimmed keeps at least the last n events of list: it lets list grow to 2n and then
// drops the older half at once, so recording stays O(1) amortized instead of moving n
// events on every append.
func trimmed(list []Event, n int) []Event {
	if len(list) <= 2*n {
		return list
	}
	return slices.Clone(list[len(list)-n:])
}

func (r *Recorder) recordWakeLocked(ev Event) {
	w := Wake{At: ev.At, Phases: *ev.Phases, Err: ev.Err}
	list, known := r.wakes[ev.Host]
	list = append(list, w)
	if len(list) > wakesPerHost {
		list = list[len(list)-wakesPerHost:]
	}
	r.wakes[ev.Host] = list
	if known {
		r.wakeLRU = slices.DeleteFunc(r.wakeLRU, func(h string) bool { return h == ev.Host })
	}
	r.wakeLRU = append(r.wakeLRU, ev.Host)
	if len(r.wakeLRU) > maxWakeHosts {
		delete(r.wakes, r.wakeLRU[0])
		r.wakeLRU = r.wakeLRU[1:]
	}
	if ev.Err == "" {
		r.latency[latencyBucket(w.Phases.Total())]++
	}
}

func latencyBucket(d time.Duration) int {
	for i, b := range LatencyBounds {
		if d <= b {
			return i
		}
	}
	return len(LatencyBounds)
}

// Subscribe returns a channel of the events recorded from now on and a func that ends
// the subscription (and closes the channel).
func (r *Recorder) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, subscriberBuf)
	r.mu.Lock()
	r.subs[ch] = struct{}{}
	r.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.subs, ch)
			r.mu.Unlock()
			close(ch)
		})
	}
}

// Events returns the kept events with a sequence number above after, oldest first, and
// at most limit of the newest (limit <= 0: all).
func (r *Recorder) Events(after uint64, limit int) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.events, after+1, func(e Event, seq uint64) int {
		switch {
		case e.Seq < seq:
			return -1
		case e.Seq > seq:
			return 1
		}
		return 0
	})
	events := r.events[i:]
	if len(r.events) > maxEvents {
		events = r.events[max(i, len(r.events)-maxEvents):]
	}
	if limit > 0 && len(events) > limit {
		events = events[len(events)-limit:]
	}
	return slices.Clone(events)
}

// Wakes returns host's last wakes, oldest first.
func (r *Recorder) Wakes(host string) []Wake {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.wakes[host])
}

// Charts returns the charts' data.
func (r *Recorder) Charts() Charts {
	r.mu.Lock()
	defer r.mu.Unlock()
	switches := r.switches[max(0, len(r.switches)-maxEvents):]
	c := Charts{Samples: slices.Clone(r.samples), Awake: slices.Clone(r.awake), DERPSwitches: slices.Clone(switches), DERP: r.prev != nil && r.prev.derp != (DERP{}) || len(r.switches) > 0}
	for i, n := range r.latency {
		b := LatencyBucket{Count: n}
		if i < len(LatencyBounds) {
			b.Le = LatencyBounds[i]
			b.Label = "≤" + shortDuration(b.Le)
		} else {
			b.Label = ">" + shortDuration(LatencyBounds[len(LatencyBounds)-1])
		}
		c.WakeLatency = append(c.WakeLatency, b)
	}
	return c
}

// Sample reads the source once at now: appends a chart point and records the events that
// the difference from the previous sample shows.
func (r *Recorder) Sample(ctx context.Context, now time.Time) {
	cur := &sampled{at: now, stats: r.src.Stats(), boxes: map[string]Box{}}
	fleetCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	f, err := r.src.Fleet(fleetCtx)
	cancel()
	if err == nil {
		// The events derived below make pages refresh: they must see this read.
		r.fleetMu.Lock()
		r.fleet, r.fleetErr, r.fleetAt = f, nil, now
		r.fleetMu.Unlock()
		cur.fleet = f.Mesh
		for _, b := range f.Boxes {
			cur.boxes[b.Self] = b
		}
	}
	if r.derp != nil {
		cur.derp, _ = r.derp.DERP()
	}

	r.mu.Lock()
	prev := r.prev
	s := Sample{At: now, Awake: cur.stats.Awake, Held: cur.stats.Held, DERPHome: cur.derp.Home}
	if prev != nil {
		if el := now.Sub(prev.at).Minutes(); el > 0 {
			s.RequestsPerMin = rate(prev.stats.Requests, cur.stats.Requests, el)
			s.BucketPerMin = rate(prev.stats.BucketRequests, cur.stats.BucketRequests, el)
		}
	}
	if err != nil && prev != nil {
		cur.boxes, cur.fleet = prev.boxes, prev.fleet // keep the last view of the fleet
	}
	r.samples = append(r.samples, s)
	if len(r.samples) > maxSamples {
		r.samples = slices.Delete(r.samples, 0, len(r.samples)-maxSamples)
	}
	r.prev = cur
	r.addAwakeLocked(now, cur.stats.Awake)
	r.mu.Unlock()

	if prev == nil {
		return
	}
	for _, ev := range diff(prev, cur) {
		ev.At = now
		r.Record(ev)
	}
}

func (r *Recorder) addAwake(at time.Time, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addAwakeLocked(at, n)
}

// addAwakeLocked appends an awake point, dropping points older than the oldest sample.
func (r *Recorder) addAwakeLocked(at time.Time, n int) {
	r.awake = append(r.awake, Point{At: at, Value: float64(n)})
	drop := 0
	for drop < len(r.awake)-1 && (len(r.awake)-drop > maxAwakePts || len(r.samples) > 0 && r.awake[drop].At.Before(r.samples[0].At)) {
		drop++
	}
	r.awake = slices.Delete(r.awake, 0, drop)
}

func rate(prev, cur uint64, minutes float64) float64 {
	if cur < prev { // the source restarted its totals
		return 0
	}
	return float64(cur-prev) / minutes
}

// diff derives the events between two samples.
func diff(prev, cur *sampled) []Event {
	var out []Event
	for _, self := range slices.Sorted(maps.Keys(cur.boxes)) {
		b := cur.boxes[self]
		p, was := prev.boxes[self]
		switch {
		case !was && cur.fleet && prev.fleet:
			out = append(out, Event{Type: EventBoxJoined, Box: self, Detail: "region " + orNone(b.Region)})
		case was && b.Draining && !p.Draining:
			out = append(out, Event{Type: EventDraining, Box: self, Detail: "checkpointing its spaces before it leaves"})
		}
		if b.This && was {
			if d := replicationDetail(p.Counters, b.Counters); d != "" {
				out = append(out, Event{Type: EventReplication, Box: self, Detail: d})
			}
		}
		if !b.This && was && b.Error == "" && p.Error == "" {
			// Another box's wakes and sleeps, as its status shows them (this box's own
			// come from its engine, with their timings).
			for _, h := range b.Awake {
				if !slices.Contains(p.Awake, h) {
					out = append(out, Event{Type: EventWake, Host: h, Box: self, Detail: "seen awake"})
				}
			}
			for _, h := range p.Awake {
				if !slices.Contains(b.Awake, h) {
					out = append(out, Event{Type: EventSleep, Host: h, Box: self, Detail: "no longer awake"})
				}
			}
		}
	}
	for _, self := range slices.Sorted(maps.Keys(prev.boxes)) {
		p := prev.boxes[self]
		if _, ok := cur.boxes[self]; ok || p.Draining {
			continue // a drained box left on purpose; its leases were released
		}
		d := "heartbeat missing: its spaces are free for the other boxes"
		if len(p.Awake) > 0 {
			d = fmt.Sprintf("heartbeat missing: %d awake space(s) fail over on their next request", len(p.Awake))
		}
		out = append(out, Event{Type: EventFailover, Box: self, Detail: d})
	}
	if cur.derp.Home != prev.derp.Home && cur.derp.Home != 0 {
		out = append(out, Event{Type: EventDERPSwitch, Detail: fmt.Sprintf("home region %d → %d", prev.derp.Home, cur.derp.Home)})
	}
	return out
}

// replicationDetail describes the replication counters' growth, or "" when none grew.
func replicationDetail(prev, cur map[string]uint64) string {
	grew := func(name string) uint64 {
		if cur[name] < prev[name] {
			return 0
		}
		return cur[name] - prev[name]
	}
	out, in, fail, tomb := grew("fanouts"), grew("rows_in"), grew("fanout_errors"), grew("tombstones_in")
	if out+in+fail+tomb == 0 {
		return ""
	}
	return fmt.Sprintf("%d row(s) fanned out, %d failed; %d row(s) and %d tombstone(s) in", out, fail, in, tomb)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// shortDuration formats a histogram bound: 50ms, 1s, 2.5s.
func shortDuration(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%gs", d.Seconds())
}
