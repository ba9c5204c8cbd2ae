package mesh_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
)

func members(n int) []mesh.Member {
	ms := make([]mesh.Member, n)
	for i := range ms {
		ms[i] = mesh.Member{Self: fmt.Sprintf("https://box-%d.example.net", i+1)}
	}
	return ms
}

// TestPlacementMovedFraction prints, and bounds, the share of 100,000 hosts whose owner
// changes when a fourth box joins three: rendezvous hashing should move about 1/4, and
// only onto the new box.
func TestPlacementMovedFraction(t *testing.T) {
	const n = 100_000
	three, four := members(3), members(4)
	moved, wrong := 0, 0
	for i := 0; i < n; i++ {
		host := fmt.Sprintf("%x.example.com", i*7919)
		before, _ := mesh.Owner(host, three, "")
		after, _ := mesh.Owner(host, four, "")
		if before.Self != after.Self {
			moved++
			if after.Self != four[3].Self {
				wrong++
			}
		}
	}
	frac := float64(moved) / n
	t.Logf("placement: 4th box joins 3: %d of %d hosts moved (%.4f; ideal 0.25), %d moved between old boxes", moved, n, frac, wrong)
	if frac < 0.25*0.8 || frac > 0.25*1.2 || wrong != 0 {
		t.Fatalf("moved fraction %.4f (wrong moves %d), want 0.25 ± 20%% and only onto the new box", frac, wrong)
	}
}

func benchmarkOwner(b *testing.B, n int) {
	ms := members(n)
	hosts := make([]string, 1024)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%d.example.com", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		mesh.Owner(hosts[i&1023], ms, "")
	}
}

// BenchmarkOwner3 and BenchmarkOwner100: HRW cost per request.
func BenchmarkOwner3(b *testing.B)   { benchmarkOwner(b, 3) }
func BenchmarkOwner100(b *testing.B) { benchmarkOwner(b, 100) }

// TestIdleRequestsPerHour runs three boxes for one hour of fake time (testing/synctest)
// at the default intervals and counts each box's bucket requests, with 0 and with 1,000
// spaces' objects in the bucket: membership cost must not grow with the spaces.
func TestIdleRequestsPerHour(t *testing.T) {
	for _, spaces := range []int{0, 1000} {
		synctest.Test(t, func(t *testing.T) {
			store := membucket.New()
			store.Granularity = time.Second
			ctx := context.Background()
			for i := 0; i < spaces; i++ {
				key := fmt.Sprintf("spaces/s%d.example.com/manifest", i)
				store.Put(ctx, key, strings.NewReader("{}"), 2, bucket.Cond{})
			}
			var counters []*membucket.Counting
			var ms []*mesh.Membership
			for i := 0; i < 3; i++ {
				c := membucket.NewCounting(store)
				m, err := mesh.NewMembership(c, mesh.MembershipConfig{
					Self: fmt.Sprintf("https://box-%d.example.net", i), Domains: []string{"example.com"},
				})
				if err != nil {
					t.Fatal(err)
				}
				m.Start(ctx)
				counters, ms = append(counters, c), append(ms, m)
			}
			time.Sleep(time.Hour)
			synctest.Wait()
			for _, m := range ms {
				m.Close()
			}
			for i, c := range counters {
				cnt := c.Counts()
				t.Logf("idle hour, %d spaces, beat %s: box %d made %d requests %v", spaces, mesh.DefaultBeat, i, c.Total(), cnt)
				// 240 beats (+1 at start): a PUT and a LIST each, and a GET per peer
				// on first sight only.
				if cnt[membucket.OpPut] != 241 || cnt[membucket.OpList] != 241 || cnt[membucket.OpGet] > 2 {
					t.Fatalf("box %d: %v", i, cnt)
				}
			}
		})
	}
}
