package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

func fleet(n int, regions ...string) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{Self: fmt.Sprintf("https://box-%04d.example.net", i)}
		if len(regions) > 0 {
			ms[i].Region = regions[i%len(regions)]
		}
	}
	return ms
}

// TestPlacementAgreesWithOwner: the cached answer is the uncached one, for every host,
// home region and view, including views that change under it.
func TestPlacementAgreesWithOwner(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var p Placement
	if _, ok := p.Owner("a.example.com", ""); ok {
		t.Fatal("the zero Placement placed a host")
	}
	for round := 0; round < 40; round++ {
		n := rng.IntN(30)
		view := fleet(n, "fi", "ie", "")
		for i := range view {
			view[i].Draining = rng.IntN(5) == 0
		}
		// Drop some members so views differ in more than their length.
		view = slicesDeleteRandom(rng, view)
		p.SetView(view)
		for q := 0; q < 300; q++ {
			host := fmt.Sprintf("s%d.example.com", rng.IntN(100))
			region := []string{"", "fi", "ie", "us"}[rng.IntN(4)]
			want, wantOK := Owner(host, view, region)
			got, ok := p.Owner(host, region)
			if ok != wantOK || got.Self != want.Self || got.Region != want.Region {
				t.Fatalf("round %d: Owner(%s, %q) = %q %v, want %q %v", round, host, region, got.Self, ok, want.Self, wantOK)
			}
		}
	}
}

func slicesDeleteRandom(rng *rand.Rand, ms []Member) []Member {
	out := ms[:0]
	for _, m := range ms {
		if rng.IntN(4) != 0 {
			out = append(out, m)
		}
	}
	return out
}

// TestPlacementGeneration: a beat that finds the same fleet keeps the generation (and
// the cache); whatever changes placement starts a new one, and the cached answers follow.
func TestPlacementGeneration(t *testing.T) {
	var p Placement
	view := fleet(5, "fi", "ie")
	if !p.SetView(view) || p.Gen() != 1 {
		t.Fatalf("first view: gen %d", p.Gen())
	}
	host := "x.example.com"
	o, _ := p.Owner(host, "fi")
	first := o.Self

	// The next beat: same members, older heartbeats, new slices.
	again := fleet(5, "fi", "ie")
	for i := range again {
		again[i].Age = 7 * time.Second
		again[i].LastModified = time.Unix(int64(i), 0)
		again[i].Incarnation = "other"
	}
	if p.SetView(again) || p.Gen() != 1 {
		t.Fatalf("an unchanged fleet started generation %d", p.Gen())
	}

	// The owner drains: a new generation, and the host moves within fi.
	drained := fleet(5, "fi", "ie")
	for i := range drained {
		drained[i].Draining = drained[i].Self == first
	}
	if !p.SetView(drained) || p.Gen() != 2 {
		t.Fatalf("a drain kept generation %d", p.Gen())
	}
	moved, ok := p.Owner(host, "fi")
	want, _ := Owner(host, drained, "fi")
	if !ok || moved.Self == first || moved.Self != want.Self {
		t.Fatalf("after the owner drained: %q, want %q (not %q)", moved.Self, want.Self, first)
	}

	// A region change is a change; so is a change of domains, a join and a leave.
	regions := fleet(5, "fi", "ie")
	regions[0].Region = "us"
	domains := fleet(5, "fi", "ie")
	domains[0].Region = "us"
	domains[1].Domains = []string{"example.net"}
	for _, v := range [][]Member{regions, domains, fleet(6, "fi", "ie"), fleet(4, "fi", "ie")} {
		before := p.Gen()
		if !p.SetView(v) || p.Gen() != before+1 {
			t.Fatalf("view of %d members kept generation %d", len(v), p.Gen())
		}
	}
}

// TestPlacementHas: Has is membership of the view, whatever order the caller passed.
func TestPlacementHas(t *testing.T) {
	var p Placement
	if p.Has("https://box-0000.example.net") {
		t.Fatal("the zero Placement has a member")
	}
	view := fleet(7)
	view[0], view[6] = view[6], view[0]
	view[3].Draining = true
	p.SetView(view)
	for _, m := range view {
		if !p.Has(m.Self) {
			t.Errorf("view member %s missing", m.Self)
		}
	}
	for _, self := range []string{"https://box-0007.example.net", "https://box-000.example.net", ""} {
		if p.Has(self) {
			t.Errorf("%q is no member", self)
		}
	}
	// The order the caller passed does not make a new generation.
	again := fleet(7)
	again[3].Draining = true
	if p.SetView(again) {
		t.Error("the same fleet in another order started a generation")
	}
}

// TestPlacementCopiesView: the caller may reuse its slice; the view does not change under
// the cache.
func TestPlacementCopiesView(t *testing.T) {
	var p Placement
	view := fleet(3)
	p.SetView(view)
	got, _ := p.Owner("h.example.com", "")
	for i := range view {
		view[i].Self = "https://mutated.example.net"
	}
	if again, _ := p.Owner("h.example.com", ""); again.Self != got.Self {
		t.Fatalf("owner changed from %q to %q when the caller's slice changed", got.Self, again.Self)
	}
}

// TestPlacementConcurrent runs readers against a writer that keeps changing the view
// (for -race), and checks every answer names a member of some view the writer set.
func TestPlacementConcurrent(t *testing.T) {
	var p Placement
	p.SetView(fleet(10))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				o, ok := p.Owner(fmt.Sprintf("s%d.example.com", i%50), "")
				if !ok || len(o.Self) == 0 {
					t.Errorf("no owner")
					return
				}
			}
		}()
	}
	for i := 0; i < 200; i++ {
		p.SetView(fleet(10 + i%5))
	}
	close(stop)
	wg.Wait()
}

// BenchmarkPlacement is the cost of placing one request at 10, 100 and 1,000 members:
// hrw is Owner over the view (what every request paid), cached is Placement.Owner after
// warm-up (each host already asked once in this view). It cycles through 4,096 hosts so
// the cache is a real map, not one hot entry.
//
//	go test ./mesh -run '^$' -bench Placement -benchmem
func BenchmarkPlacement(b *testing.B) {
	hosts := make([]string, 4096)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%d.example.com", i)
	}
	for _, n := range []int{10, 100, 1000} {
		view := fleet(n, "fi", "ie", "us")
		b.Run(fmt.Sprintf("members=%d/hrw", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				Owner(hosts[i&4095], view, "")
			}
		})
		b.Run(fmt.Sprintf("members=%d/hrw_region", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				Owner(hosts[i&4095], view, "fi")
			}
		})
		var p Placement
		p.SetView(view)
		for _, h := range hosts {
			p.Owner(h, "")
			p.Owner(h, "fi")
		}
		b.Run(fmt.Sprintf("members=%d/cached", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p.Owner(hosts[i&4095], "")
			}
		})
		b.Run(fmt.Sprintf("members=%d/cached_region", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p.Owner(hosts[i&4095], "fi")
			}
		})
		b.Run(fmt.Sprintf("members=%d/cached_parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					p.Owner(hosts[i&4095], "")
				}
			})
		})
	}
}

// startedMembership is a Membership of n members (itself and n-1 heartbeats already in
// an in-memory bucket) after its first beat, with a beat long enough that no other beat
// runs during a benchmark.
func startedMembership(tb testing.TB, n int) *Membership {
	tb.Helper()
	store := membucket.New()
	ctx := context.Background()
	for i := 1; i < n; i++ {
		body, _ := json.Marshal(Heartbeat{Region: []string{"fi", "ie", "us"}[i%3], Domains: []string{"example.com"}, Incarnation: fmt.Sprint(i)})
		if _, err := store.Put(ctx, HeartbeatKey(fmt.Sprintf("https://box-%04d.example.net", i)), bytes.NewReader(body), int64(len(body)), bucket.Cond{}); err != nil {
			tb.Fatal(err)
		}
	}
	m, err := NewMembership(store, MembershipConfig{Self: "https://box-0000.example.net", Domains: []string{"example.com"},
		Beat: time.Hour, DeadAfter: 3 * time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(m.Close)
	if got := len(m.Live()); got != n {
		tb.Fatalf("view of %d members, want %d", got, n)
	}
	return m
}

// TestMembershipPlacement: the membership's placement is its view's: it agrees with
// Owner over Live, keeps its generation while beats find the same fleet, and changes
// when this box drains.
func TestMembershipPlacement(t *testing.T) {
	m := startedMembership(t, 20)
	p := m.Placement()
	gen := p.Gen()
	check := func() {
		t.Helper()
		live := m.Live()
		for i := 0; i < 200; i++ {
			h := fmt.Sprintf("s%d.example.com", i)
			want, _ := Owner(h, live, "ie")
			if got, _ := p.Owner(h, "ie"); got.Self != want.Self {
				t.Fatalf("placement says %s for %s, Owner over Live says %s", got.Self, h, want.Self)
			}
		}
	}
	check()
	m.refresh(context.Background())
	if p.Gen() != gen {
		t.Fatalf("a beat that found the same fleet moved the generation from %d to %d", gen, p.Gen())
	}
	m.MarkDraining(context.Background())
	if p.Gen() == gen {
		t.Fatal("draining kept the placement generation")
	}
	check()
	if o, _ := p.Owner("s1.example.com", ""); o.Self == m.Config().Self {
		t.Fatal("a draining box still owns a host")
	}
}

// BenchmarkRequestPlacement is the placement cost of one request on a box of a fleet of
// 10, 100 and 1,000 members, through a real Membership: live_hrw is what the request
// path paid before the cache (a copy of the live view, then HRW over it), cached is
// Membership.Placement after warm-up; holder_* is the check that a space's last holder
// is a live box (Node.IsLiveMember), by a copy of the view and by the placement's view.
//
//	go test ./mesh -run '^$' -bench RequestPlacement -benchmem
func BenchmarkRequestPlacement(b *testing.B) {
	hosts := make([]string, 4096)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%d.example.com", i)
	}
	for _, n := range []int{10, 100, 1000} {
		m := startedMembership(b, n)
		b.Run(fmt.Sprintf("members=%d/live_hrw", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				Owner(hosts[i&4095], m.Live(), "")
			}
		})
		p := m.Placement()
		for _, h := range hosts {
			p.Owner(h, "")
		}
		box := &Node{Self: m.Config().Self, Live: m.Live}
		peer := fmt.Sprintf("https://box-%04d.example.net", n/2)
		b.Run(fmt.Sprintf("members=%d/holder_live_copy", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				box.IsLiveMember(peer)
			}
		})
		cachedBox := &Node{Self: m.Config().Self, Live: m.Live, Placement: p}
		b.Run(fmt.Sprintf("members=%d/holder_placement", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				cachedBox.IsLiveMember(peer)
			}
		})
		b.Run(fmt.Sprintf("members=%d/cached", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m.Placement().Owner(hosts[i&4095], "")
			}
		})
	}
}
