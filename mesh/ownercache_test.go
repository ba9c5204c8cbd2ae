package mesh

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
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
			if ok != wantOK || got != want.Self {
				t.Fatalf("round %d: Owner(%s, %q) = %q %v, want %q %v", round, host, region, got, ok, want.Self, wantOK)
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
	first, _ := p.Owner(host, "fi")

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
	if !ok || moved == first || moved != want.Self {
		t.Fatalf("after the owner drained: %q, want %q (not %q)", moved, want.Self, first)
	}

	// A region change is a change; a join is a change; a leave is a change.
	regions := fleet(5, "fi", "ie")
	regions[0].Region = "us"
	for _, v := range [][]Member{regions, fleet(6, "fi", "ie"), fleet(4, "fi", "ie")} {
		before := p.Gen()
		if !p.SetView(v) || p.Gen() != before+1 {
			t.Fatalf("view of %d members kept generation %d", len(v), p.Gen())
		}
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
	if again, _ := p.Owner("h.example.com", ""); again != got {
		t.Fatalf("owner changed from %q to %q when the caller's slice changed", got, again)
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
				self, ok := p.Owner(fmt.Sprintf("s%d.example.com", i%50), "")
				if !ok || len(self) == 0 {
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
