package fleetview

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// stubSource is a Source whose readings the test sets.
type stubSource struct {
	mu    sync.Mutex
	fleet Fleet
	stats Stats
	derp  DERP
}

func (s *stubSource) Fleet(context.Context) (Fleet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fleet, nil
}
func (s *stubSource) Spaces(context.Context, string, int) ([]Space, error) { return nil, nil }
func (s *stubSource) Stored(context.Context, string) (Stored, bool, error) {
	return Stored{}, false, nil
}
func (s *stubSource) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}
func (s *stubSource) Subscribe(func(Event)) func() { return func() {} }
func (s *stubSource) DERP() (DERP, bool)           { return s.derp, true }

func types(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+":"+e.Box)
	}
	return out
}

func TestRecorderDerivesFleetEventsAndRates(t *testing.T) {
	src := &stubSource{
		fleet: Fleet{Mesh: true, Boxes: []Box{
			{Self: "http://a", Region: "fi", This: true, Counters: map[string]uint64{"fanouts": 1}},
			{Self: "http://b", Region: "fi", Awake: []string{"x.test"}},
			{Self: "http://c", Region: "de"},
		}},
		stats: Stats{Requests: 100, BucketRequests: 10, Awake: 1},
		derp:  DERP{Home: 1},
	}
	r := NewRecorder(src, src)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r.Sample(context.Background(), t0)
	if evs := r.Events(0, 0); len(evs) != 0 {
		t.Fatalf("first sample derived events: %v", types(evs))
	}

	src.fleet = Fleet{Mesh: true, Boxes: []Box{
		{Self: "http://a", Region: "fi", This: true, Counters: map[string]uint64{"fanouts": 4}},
		{Self: "http://c", Region: "de", Draining: true, Awake: []string{"y.test"}},
		{Self: "http://d", Region: "de"},
	}}
	src.stats = Stats{Requests: 160, BucketRequests: 40, Awake: 2}
	src.derp = DERP{Home: 2, Commits: 1}
	r.Sample(context.Background(), t0.Add(30*time.Second))

	got := types(r.Events(0, 0))
	want := []string{"replication:http://a", "draining:http://c", "wake:http://c", "box_joined:http://d", "failover:http://b", "derp_switch:"}
	if !slices.Equal(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}

	// A drained box that leaves is not a failover.
	src.fleet.Boxes = src.fleet.Boxes[:1]
	r.Sample(context.Background(), t0.Add(60*time.Second))
	if got := types(r.Events(6, 0)); !slices.Equal(got, []string{"failover:http://d"}) {
		t.Fatalf("after c drained and d vanished: %v", got)
	}

	c := r.Charts()
	if len(c.Samples) != 3 || c.Samples[1].RequestsPerMin != 120 || c.Samples[1].BucketPerMin != 60 || c.Samples[1].Awake != 2 || c.Samples[1].DERPHome != 2 {
		t.Fatalf("samples = %+v", c.Samples)
	}
	if len(c.DERPSwitches) != 1 || !c.DERP {
		t.Fatalf("derp switches = %+v", c.DERPSwitches)
	}
}

func TestRecorderWakesHistogramAndSubscribers(t *testing.T) {
	r := NewRecorder(&stubSource{}, nil)
	ch, cancel := r.Subscribe()
	for i, total := range []time.Duration{40 * time.Millisecond, 700 * time.Millisecond, time.Minute} {
		r.Record(Event{Type: EventWake, Host: "h.test", Phases: &Phases{Lease: total / 2, Ready: total - total/2}})
		if ev := <-ch; ev.Seq != uint64(i+1) || ev.Host != "h.test" {
			t.Fatalf("subscriber got %+v", ev)
		}
	}
	r.Record(Event{Type: EventWake, Host: "h.test", Phases: &Phases{Lease: time.Second}, Err: "lease held"})
	cancel()
	cancel()                                          // idempotent
	r.Record(Event{Type: EventSleep, Host: "h.test"}) // no subscriber left: must not block or panic

	ws := r.Wakes("h.test")
	if len(ws) != 4 || ws[3].Err != "lease held" || ws[1].Phases.Total() != 700*time.Millisecond {
		t.Fatalf("wakes = %+v", ws)
	}
	var counts []uint64
	for _, b := range r.Charts().WakeLatency {
		counts = append(counts, b.Count)
	}
	// A failed wake is not a latency.
	if want := []uint64{1, 0, 0, 0, 1, 0, 0, 0, 0, 1}; !slices.Equal(counts, want) {
		t.Fatalf("histogram = %v, want %v", counts, want)
	}
	for i := 0; i < 10; i++ {
		r.Record(Event{Type: EventWake, Host: "h.test", Phases: &Phases{}})
	}
	if n := len(r.Wakes("h.test")); n != wakesPerHost {
		t.Fatalf("kept %d wakes per host, want %d", n, wakesPerHost)
	}
	if evs := r.Events(10, 3); len(evs) != 3 || evs[2].Seq != 15 || evs[0].Seq != 13 {
		t.Fatalf("Events(10, 3) = %+v", evs)
	}
}

func TestRegionsAndJoin(t *testing.T) {
	f := Fleet{Boxes: []Box{{Self: "b", Region: "fi", Awake: []string{"x"}}, {Self: "a"}, {Self: "c", Region: "de", Awake: []string{"x"}}}}
	var names []string
	for _, rg := range f.Regions() {
		names = append(names, rg.Name)
	}
	if !slices.Equal(names, []string{"de", "fi", ""}) {
		t.Fatalf("regions = %q", names)
	}
	sp := []Space{{Host: "x"}, {Host: "y"}}
	Join(sp, f)
	if !slices.Equal(sp[0].AwakeOn, []string{"b", "c"}) || sp[1].AwakeOn != nil {
		t.Fatalf("join = %+v", sp)
	}
	// A space's held connections are summed over the boxes that hold them, wherever it
	// is awake; a second Join with fewer boxes forgets the old sums.
	f.Boxes[0].Conns = map[string]Conns{"y": {Open: 2, Parked: 1, PendingBytes: 10}}
	f.Boxes[1].Conns = map[string]Conns{"y": {Open: 3, Parked: 3, PendingBytes: 5}, "x": {Open: 1}}
	Join(sp, f)
	if sp[1].FleetConns == nil || *sp[1].FleetConns != (Conns{Open: 5, Parked: 4, PendingBytes: 15}) || !slices.Equal(sp[1].HeldOn, []string{"a", "b"}) {
		t.Fatalf("held in the fleet = %+v on %q; want 5 open, 4 parked, 15 bytes on a, b", sp[1].FleetConns, sp[1].HeldOn)
	}
	if sp[0].FleetConns == nil || sp[0].FleetConns.Open != 1 || !slices.Equal(sp[0].HeldOn, []string{"a"}) {
		t.Fatalf("x held in the fleet = %+v on %q", sp[0].FleetConns, sp[0].HeldOn)
	}
	f.Boxes[1].Conns = nil
	Join(sp, f)
	if sp[0].FleetConns != nil || sp[0].HeldOn != nil || sp[1].FleetConns.Open != 2 {
		t.Fatalf("after box a let go: x %+v on %q, y %+v", sp[0].FleetConns, sp[0].HeldOn, sp[1].FleetConns)
	}
	if !Match("Chat.Example.com", " chat") || Match("a.b", "z") {
		t.Fatal("Match")
	}
}

// BenchmarkRecord is the cost an engine goroutine pays per event for the console: with
// no SSE subscriber and with one that keeps up. Compare the two in one run.
func BenchmarkRecord(b *testing.B) {
	for _, subs := range []int{0, 1} {
		b.Run(fmt.Sprintf("subscribers=%d", subs), func(b *testing.B) {
			r := NewRecorder(&stubSource{}, nil)
			if subs > 0 {
				ch, cancel := r.Subscribe()
				defer cancel()
				go func() {
					for range ch {
					}
				}()
			}
			ev := Event{Type: EventWake, Host: "h.test", Phases: &Phases{Lease: time.Millisecond, Ready: 100 * time.Millisecond}}
			b.ReportAllocs()
			for b.Loop() {
				r.Record(ev)
			}
		})
	}
}

func TestRecorderKeepsTheLastEvents(t *testing.T) {
	r := NewRecorder(&stubSource{}, nil)
	for i := 0; i < 3*maxEvents+7; i++ {
		r.Record(Event{Type: EventSleep})
	}
	evs := r.Events(0, 0)
	if len(evs) != maxEvents || evs[len(evs)-1].Seq != 3*maxEvents+7 || evs[0].Seq != 2*maxEvents+8 {
		t.Fatalf("kept %d events, seq %d..%d; want the last %d", len(evs), evs[0].Seq, evs[len(evs)-1].Seq, maxEvents)
	}
	if evs := r.Events(3*maxEvents, 0); len(evs) != 7 {
		t.Fatalf("Events(after) = %d, want 7", len(evs))
	}
}
