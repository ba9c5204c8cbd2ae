package mesh_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
)

// simMember is one box of the simulated fleet: a real Membership on its own counting
// view of the shared in-memory bucket.
type simMember struct {
	m       *mesh.Membership
	c       *membucket.Counting
	self    string
	inc     string
	stopped bool
}

// sim is a fleet of Memberships on one in-memory bucket inside a synctest bubble.
type sim struct {
	t      *testing.T
	ctx    context.Context
	store  *membucket.Bucket
	all    []*simMember
	nextID int
}

var simRegions = []string{"fi", "ie", "us"}

func (s *sim) join() *simMember {
	s.t.Helper()
	id := s.nextID
	s.nextID++
	sm := &simMember{
		self: fmt.Sprintf("https://box-%05d.example.net", id),
		inc:  fmt.Sprintf("inc-%d", id),
		c:    membucket.NewCounting(s.store),
	}
	m, err := mesh.NewMembership(sm.c, mesh.MembershipConfig{
		Self: sm.self, Region: simRegions[id%len(simRegions)], Domains: []string{"example.com"},
		Incarnation: sm.inc, Version: "sim",
	})
	if err != nil {
		s.t.Fatal(err)
	}
	sm.m = m
	if err := m.Start(s.ctx); err != nil {
		s.t.Fatal(err)
	}
	s.all = append(s.all, sm)
	return sm
}

// running is every member whose process still runs (draining ones included).
func (s *sim) running() []*simMember {
	var out []*simMember
	for _, sm := range s.all {
		if !sm.stopped {
			out = append(out, sm)
		}
	}
	return out
}

// converge advances the fake clock a second at a time until cond holds for every running
// member, and returns how long that took in beats: on average per member, and until the
// last one. cond must stay true once it holds (each member is asked until it does).
func (s *sim) converge(what string, limit time.Duration, cond func(*simMember) bool) (mean, last float64) {
	s.t.Helper()
	start := time.Now()
	pending := s.running()
	var sum time.Duration
	total := len(pending)
	for {
		synctest.Wait()
		since := time.Since(start)
		left := pending[:0]
		for _, sm := range pending {
			if cond(sm) {
				sum += since
			} else {
				left = append(left, sm)
			}
		}
		pending = left
		if len(pending) == 0 {
			b := mesh.DefaultBeat.Seconds()
			return sum.Seconds() / float64(total) / b, since.Seconds() / b
		}
		if since > limit {
			s.t.Fatalf("%s: %d of %d members not converged after %v", what, len(pending), total, limit)
		}
		time.Sleep(time.Second)
	}
}

// member returns self's entry in sm's live view.
func member(sm *simMember, self string) (mesh.Member, bool) {
	live := sm.m.Live()
	i := sort.Search(len(live), func(i int) bool { return live[i].Self >= self })
	if i < len(live) && live[i].Self == self {
		return live[i], true
	}
	return mesh.Member{}, false
}

// agree checks that every running member holds the same placement view (members,
// regions, draining flags) of want members, so each places every host alike.
func (s *sim) agree(want int) {
	s.t.Helper()
	run := s.running()
	ref := run[0].m.Live()
	if len(ref) != want {
		s.t.Fatalf("%s sees %d live members, want %d", run[0].self, len(ref), want)
	}
	for _, sm := range run {
		live := sm.m.Live()
		if len(live) != len(ref) {
			s.t.Fatalf("%s sees %d members, %s sees %d", sm.self, len(live), run[0].self, len(ref))
		}
		for i := range live {
			if live[i].Self != ref[i].Self || live[i].Region != ref[i].Region || live[i].Draining != ref[i].Draining {
				s.t.Fatalf("%s and %s disagree on member %d: %+v vs %+v", sm.self, run[0].self, i, live[i], ref[i])
			}
		}
	}
}

// counts sums the bucket requests of members since their last reset.
func counts(ms []*simMember) map[membucket.Op]int64 {
	out := map[membucket.Op]int64{}
	for _, sm := range ms {
		for op, n := range sm.c.Counts() {
			out[op] += n
		}
	}
	return out
}

func resetCounts(ms []*simMember) {
	for _, sm := range ms {
		sm.c.Reset()
	}
}

// movedOnJoin is the share of hosts whose owner changes between before and after, and
// how many of them moved anywhere but onto joiner.
func movedOnJoin(before, after []mesh.Member, joiner string, hosts []string) (frac float64, wrong int) {
	moved := 0
	for _, h := range hosts {
		b, _ := mesh.Owner(h, before, "")
		a, _ := mesh.Owner(h, after, "")
		if a.Self != b.Self {
			moved++
			if a.Self != joiner {
				wrong++
			}
		}
	}
	return float64(moved) / float64(len(hosts)), wrong
}

// TestFleetSimulation runs a fleet of real Memberships at the default intervals (beat
// 15 s, dead after 45 s) on one in-memory bucket whose clock is the store's (1 s
// granularity, 2 s ahead of the boxes), in fake time (testing/synctest), and prints:
// convergence in beats after a cold start, joins, a drain, a leave and kills; bucket
// requests per member per hour in the steady state; the share of hosts that move per join
// (HRW: about 1/N, all onto the new box); and heartbeat listings past one page.
//
// The normal run simulates 100 members listing in pages of 40 (seconds). The full form:
//
//	LCHAT_MESH_SIM_MEMBERS=1000 go test ./mesh -run TestFleetSimulation -v -timeout 30m
//
// runs 1,000 members with S3's page size of 1,000, and the joins push the listing to
// 1,008 heartbeats: two pages per beat.
func TestFleetSimulation(t *testing.T) {
	n, pageSize := 100, 40
	if v := os.Getenv("LCHAT_MESH_SIM_MEMBERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 10 {
			t.Fatalf("LCHAT_MESH_SIM_MEMBERS=%q: want a number >= 10", v)
		}
		pageSize = 1000
	}
	// Enough joins to push the full form's 1,000 heartbeats past one page.
	const joins = 8
	beat, deadAfter := mesh.DefaultBeat, mesh.DefaultDeadAfter
	hosts := make([]string, 20_000)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%d.example.com", i)
	}
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := membucket.New()
		store.Granularity, store.Offset, store.PageSize = time.Second, 2*time.Second, pageSize
		s := &sim{t: t, ctx: ctx, store: store}
		defer func() {
			for _, sm := range s.all {
				sm.m.Close()
			}
		}()
		pages := func(keys int) int { return (keys + pageSize - 1) / pageSize }
		logf := func(format string, args ...any) { t.Logf("sim %d members: "+format, append([]any{n}, args...)...) }

		// Cold start: the boxes come up spread over one beat, as a fleet does.
		for i := 0; i < n; i++ {
			s.join()
			time.Sleep(beat / time.Duration(n))
		}
		mean, last := s.converge("cold start", 4*beat, func(sm *simMember) bool { return len(sm.m.Live()) == n })
		s.agree(n)
		logf("cold start (spread over one beat): every member sees all %d after %.2f more beats (%.2f on average)", n, last, mean)

		// Steady state: nothing changes; a PUT and a LIST per page per beat, no GETs,
		// and no member's placement is invalidated.
		steady := func(label string, members int) {
			run := s.running()
			gens := make([]uint64, len(run))
			for i, sm := range run {
				gens[i] = sm.m.Placement().Gen()
			}
			time.Sleep(beat / 2) // between beats
			synctest.Wait()
			resetCounts(run)
			const window = 8
			time.Sleep(window * beat)
			synctest.Wait()
			c := counts(run)
			perHour := func(op membucket.Op) float64 {
				return float64(c[op]) / float64(len(run)) / window * float64(time.Hour/beat)
			}
			total := float64(0)
			for op := range c {
				total += perHour(op)
			}
			logf("steady state, %s (%d heartbeats, %d listing page(s)): %.0f bucket requests per member per hour (PUT %.0f, LIST %.0f, GET %.0f), measured over %d beats",
				label, members, pages(members), total, perHour(membucket.OpPut), perHour(membucket.OpList), perHour(membucket.OpGet), window)
			wantList := float64(pages(members)) * float64(time.Hour/beat)
			if perHour(membucket.OpPut) != float64(time.Hour/beat) || perHour(membucket.OpList) != wantList || c[membucket.OpGet] != 0 {
				t.Errorf("steady state %s: %v over %d beats of %d members, want 1 PUT and %d LIST per beat, no GET", label, c, window, len(run), pages(members))
			}
			s.agree(members)
			inval := 0
			for i, sm := range run {
				if sm.m.Placement().Gen() != gens[i] {
					inval++
				}
			}
			if inval != 0 {
				t.Errorf("steady state %s: %d members' placement changed generation", label, inval)
			}
		}
		steady("before the joins", n)

		// Joins, one at a time: how fast everyone sees the new box, and which hosts move.
		var beats, means []float64
		var fracSum float64
		var fracN, wrongTotal int
		for j := 0; j < joins; j++ {
			run := s.running()
			before := run[0].m.Live()
			resetCounts(run)
			sm := s.join()
			mean, b := s.converge("join", 3*beat, func(o *simMember) bool { return o.m.IsLive(sm.self, sm.inc) })
			beats, means = append(beats, b), append(means, mean)
			if j == 0 {
				peers := counts(run)[membucket.OpGet]
				own := sm.c.Counts()[membucket.OpGet]
				logf("join: the new box made %d GETs (one per peer's heartbeat, once), the %d others %d in all (one each, for the new heartbeat)", own, len(run), peers)
				if own != int64(len(run)) || peers != int64(len(run)) {
					t.Errorf("join: %d GETs by the new box, %d by the others, want %d each", own, peers, len(run))
				}
			}
			if j < 4 {
				after := run[0].m.Live()
				frac, wrong := movedOnJoin(before, after, sm.self, hosts)
				fracSum += frac
				fracN++
				wrongTotal += wrong
				logf("join %d: every member sees it after %.2f beats (%.2f on average); %.5f of %d hosts moved (1/N = %.5f), %d moved elsewhere than the new box",
					j+1, b, mean, frac, len(hosts), 1/float64(len(after)), wrong)
			}
		}
		sort.Float64s(beats)
		sort.Float64s(means)
		members := n + joins
		s.converge("joins settle", 2*beat, func(o *simMember) bool { return len(o.m.Live()) == members })
		s.agree(members)
		logf("%d joins: every member sees the new box after %.2f beats (median), %.2f (max); %.2f on average per member (median)",
			joins, beats[len(beats)/2], beats[len(beats)-1], means[len(means)/2])
		avg := fracSum / float64(fracN)
		if ideal := 1 / float64(n+2); avg < ideal*0.5 || avg > ideal*1.6 || wrongTotal != 0 {
			t.Errorf("hosts moved per join: %.5f (ideal about %.5f), %d moved between old boxes", avg, ideal, wrongTotal)
		}
		if pages(members) < 2 {
			t.Fatalf("the listing fits one page (%d keys, pages of %d): pagination not exercised", members, pageSize)
		}
		steady("after the joins", members)

		// A drain: peers drop the box from placement within a beat, while it stays live.
		// Each member's own placement cache (Membership.Placement, what the request path
		// reads) answers.
		drainer := s.running()[1]
		var its []string
		for _, h := range hosts {
			if o, _ := drainer.m.Placement().Owner(h, ""); o.Self == drainer.self {
				its = append(its, h)
			}
		}
		if len(its) == 0 {
			t.Fatalf("%s owns none of %d hosts", drainer.self, len(hosts))
		}
		if err := drainer.m.MarkDraining(ctx); err != nil {
			t.Fatal(err)
		}
		mean, b := s.converge("drain", 2*beat, func(o *simMember) bool {
			mem, ok := member(o, drainer.self)
			if !ok || !mem.Draining {
				return false
			}
			for _, h := range its {
				if own, _ := o.m.Placement().Owner(h, ""); own.Self == drainer.self {
					t.Fatalf("%s sees %s draining but its placement still sends %s there", o.self, drainer.self, h)
				}
			}
			return true
		})
		s.agree(members)
		logf("drain: every member takes the draining box out of placement after %.2f beats (%.2f on average; its leases still hold); its %d hosts moved", b, mean, len(its))
		if b > 1.2 {
			t.Errorf("drain took %.2f beats", b)
		}
		// Its last step, Leave, deletes the heartbeat.
		if err := drainer.m.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		drainer.stopped = true
		members--
		mean, b = s.converge("drain's leave", 2*beat, func(o *simMember) bool { return !o.m.IsLive(drainer.self, drainer.inc) })
		s.agree(members)
		logf("drain then leave: heartbeat gone from every view after %.2f beats (%.2f on average)", b, mean)

		// A leave without a drain first: the same, one listing.
		leaver := s.running()[2]
		if err := leaver.m.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		leaver.stopped = true
		members--
		mean, b = s.converge("leave", 2*beat, func(o *simMember) bool { return !o.m.IsLive(leaver.self, leaver.inc) })
		s.agree(members)
		logf("leave: gone from every view after %.2f beats (%.2f on average)", b, mean)
		if b > 1.2 {
			t.Errorf("leave took %.2f beats", b)
		}

		// Kills: 1% of the fleet (at least 2) dies at once; their heartbeats stay until
		// they are older than dead_after by the store's clock.
		kills := max(2, n/100)
		var dead []*simMember
		for _, sm := range s.running()[3 : 3+kills] {
			sm.m.Close()
			sm.stopped = true
			dead = append(dead, sm)
		}
		members -= kills
		mean, b = s.converge("kills", deadAfter+3*beat, func(o *simMember) bool {
			for _, d := range dead {
				if o.m.IsLive(d.self, d.inc) {
					return false
				}
			}
			return true
		})
		s.agree(members)
		limit := (deadAfter + beat + 2*time.Second).Seconds() / beat.Seconds()
		logf("kill -9 of %d boxes at once: gone from every view after %.2f beats (%.2f on average; dead_after %v = %.0f beats)", kills, b, mean, deadAfter, deadAfter.Seconds()/beat.Seconds())
		if b > limit {
			t.Errorf("kills took %.2f beats, want at most %.2f", b, limit)
		}
	})
}
