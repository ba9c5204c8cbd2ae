// Package mesh_test runs the mesh and ledger packages against real stores (the file
// bucket and versitygw) and prints the placement and membership cost figures.
package mesh_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/lifecycle"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	beat      = time.Second
	deadAfter = 3 * time.Second
)

func startMember(t *testing.T, b bucket.Bucket, self, region string, onFence func(bool)) *mesh.Membership {
	t.Helper()
	life := lifecycle.New()
	if onFence != nil {
		life.OnFence(onFence)
	}
	m, err := mesh.NewMembership(b, mesh.MembershipConfig{
		Self: self, Region: region, Domains: []string{"example.com"}, Version: "it",
		Beat: beat, DeadAfter: deadAfter, Lifecycle: life,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func liveSet(m *mesh.Membership) string {
	s := ""
	for _, mem := range m.Live() {
		s += mem.Self + " "
	}
	return s
}

// membershipSuite runs three members on one store: convergence within one beat, the
// steady-state request cost, death of a killed member, and a drain.
func membershipSuite(t *testing.T, store bucket.Bucket) {
	counted := membucket.NewCounting(store)
	a := startMember(t, counted, "https://a.example.net", "ie", nil)
	b := startMember(t, store, "https://b.example.net", "ie", nil)
	c := startMember(t, store, "https://c.example.net", "fi", nil)
	want := "https://a.example.net https://b.example.net https://c.example.net "
	// Within one beat (plus request latency) every member sees all three.
	harness.WaitFor(t, beat+500*time.Millisecond, "convergence within a beat", func() bool {
		return liveSet(a) == want && liveSet(b) == want && liveSet(c) == want
	}, func() string { return fmt.Sprintf("a=%q b=%q c=%q", liveSet(a), liveSet(b), liveSet(c)) })
	for _, mem := range a.Live() {
		if mem.Incarnation == "" || mem.Region == "" || mem.Version != "it" {
			t.Fatalf("member body missing: %+v", mem)
		}
	}
	for i := 0; i < 100; i++ {
		host := fmt.Sprintf("s%d.example.com", i)
		oa, _ := mesh.Owner(host, a.Live(), "")
		ob, _ := mesh.Owner(host, b.Live(), "")
		oc, _ := mesh.Owner(host, c.Live(), "")
		if oa.Self != ob.Self || ob.Self != oc.Self {
			t.Fatalf("%s: boxes disagree on the owner", host)
		}
	}

	// Steady state: one PUT and one LIST per beat; the unchanged heartbeats keep their
	// ETags on this store, so no GETs.
	time.Sleep(beat)
	counted.Reset()
	before := a.Stats().Beats
	time.Sleep(5 * beat)
	beats := a.Stats().Beats - before
	cnt := counted.Counts()
	t.Logf("%s: %d beats cost %v", store, beats, cnt)
	if cnt[membucket.OpGet] != 0 || cnt[membucket.OpPut] > beats+1 || cnt[membucket.OpList] > beats+1 || cnt[membucket.OpPut] < beats-1 {
		t.Fatalf("%d beats cost %v, want one PUT and one LIST each", beats, cnt)
	}

	// b is killed (its heartbeat rots): dead for the others after dead_after, not before.
	bInc := b.Config().Incarnation
	b.Close()
	killed := time.Now()
	harness.WaitFor(t, deadAfter+3*time.Second, "the killed member to be dead", func() bool { return !a.IsLive("https://b.example.net", bInc) })
	if since := time.Since(killed); since < deadAfter-time.Second {
		t.Fatalf("killed member dead after only %s", since)
	}
	t.Logf("%s: killed member dead for peers after %s (dead_after %s, beat %s)", store, time.Since(killed).Round(100*time.Millisecond), deadAfter, beat)

	// c drains: gone at the peers' next listing.
	if err := c.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	harness.WaitFor(t, beat+500*time.Millisecond, "the drained member to go", func() bool { return liveSet(a) == "https://a.example.net " },
		func() string { return fmt.Sprintf("a lists %q", liveSet(a)) })
	t.Logf("%s: drained member gone for peers after %s", store, time.Since(left).Round(10*time.Millisecond))
}

func TestMembershipFileBucket(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	membershipSuite(t, b)
}

func TestMembershipVersityGW(t *testing.T) {
	s3 := harness.StartS3(t)
	membershipSuite(t, s3.NewBucket(t, "mesh-it"))
}

// TestFenceBeforeTakeoverVersityGW cuts one box off from versitygw with a TCP proxy and
// checks it fences itself before its peer counts it dead, then resumes.
func TestFenceBeforeTakeoverVersityGW(t *testing.T) {
	s3 := harness.StartS3(t)
	proxy := harness.StartTCPProxy(t, s3.Endpoint[len("http://"):])
	cfg := s3.Config("mesh-fence")
	cfg.Endpoint = "http://" + proxy.Addr()
	viaProxy := newS3Bucket(t, cfg)

	fences := make(chan bool, 10)
	fencedAt := make(chan time.Time, 10)
	a := startMember(t, viaProxy, "https://a.example.net", "", func(v bool) {
		fences <- v
		if v {
			fencedAt <- time.Now()
		}
	})
	peer := startMember(t, s3.NewBucket(t, "mesh-fence"), "https://p.example.net", "", nil)
	harness.WaitFor(t, 2*beat, "the peer to see a", func() bool { return peer.IsLive("https://a.example.net", a.Config().Incarnation) })
	if v := <-fences; v {
		t.Fatal("first fence event is not the lift after the first write")
	}
	proxy.SetDown(true)
	cut := time.Now()
	var deadAt time.Time
	harness.WaitFor(t, deadAfter+4*time.Second, "the peer to count the cut-off box dead", func() bool {
		if !peer.IsLive("https://a.example.net", a.Config().Incarnation) {
			deadAt = time.Now()
			return true
		}
		return false
	})
	var fa time.Time
	select {
	case fa = <-fencedAt:
	default:
		t.Fatal("cut-off box did not fence itself before the peer counted it dead")
	}
	if !fa.Before(deadAt) {
		t.Fatalf("fenced at %s, after the peer's takeover at %s", fa.Sub(cut), deadAt.Sub(cut))
	}
	t.Logf("cut at 0: box fenced at +%s, peer counted it dead at +%s (margin %s; fence_after %s after the last good write was sent)",
		fa.Sub(cut).Round(10*time.Millisecond), deadAt.Sub(cut).Round(10*time.Millisecond), deadAt.Sub(fa).Round(10*time.Millisecond), a.FenceAfter())
	proxy.SetDown(false)
	harness.WaitFor(t, 3*beat, "the box to resume after the bucket came back", func() bool {
		return !a.Fenced() && peer.IsLive("https://a.example.net", a.Config().Incarnation)
	})
}
