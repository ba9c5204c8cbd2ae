package box_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// providerProxy is a fakeProxy that can reach providers.
type providerProxy struct {
	fakeProxy
	provider string
}

func (p *providerProxy) Provider(name string) error { p.provider = name; return nil }

// TestServeProvided: a delegated space goes to its provider, from any door that can
// reach one (any other door gets a 503); a space moving between the fleet and its
// provider is a 503 with Retry-After on either side; a hosted space is served to its own
// fleet (or a box of this fleet that forwarded it) and is an unknown host to anyone else.
func TestServeProvided(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	for _, rt := range []registry.Route{
		{Host: "out.example.com", Kind: "demo", Hibernate: true, Provider: "partner"},
		{Host: "moving.example.com", Kind: "demo", Hibernate: true, Provider: "partner", ProviderState: registry.ProviderDelegating},
		{Host: "hosted.example.com", Kind: "demo", Hibernate: true, HostedFor: "fleet-a"},
		{Host: "held.example.com", Kind: "demo", Hibernate: true, HostedFor: "fleet-a", ProviderState: registry.ProviderReclaiming},
	} {
		if _, err := b.Registry().Put(rt); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		req      box.Request
		plain    bool // a door without ProviderProxy
		status   int  // refused with; 0: not refused
		provider string
		instance bool
	}{
		{"delegated", box.Request{Host: "out.example.com"}, false, 0, "partner", false},
		{"delegated, a held connection's door", box.Request{Host: "out.example.com"}, true, 503, "", false},
		{"moving", box.Request{Host: "moving.example.com"}, false, 503, "", false},
		{"hosted, held for a take-back", box.Request{Host: "held.example.com", Client: "fleet-a", Hops: 1}, false, 503, "", false},
		{"hosted, its fleet", box.Request{Host: "hosted.example.com", Client: "fleet-a", Hops: 1}, false, 0, "", true},
		{"hosted, a peer of this fleet", box.Request{Host: "hosted.example.com", Hops: 1}, false, 0, "", true},
		{"hosted, another fleet", box.Request{Host: "hosted.example.com", Client: "fleet-b", Hops: 1}, false, 404, "", false},
		{"hosted, a client", box.Request{Host: "hosted.example.com"}, false, 404, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := &providerProxy{}
			var p box.Proxy = pp
			if tc.plain {
				p = &pp.fakeProxy
			}
			b.Serve(t.Context(), tc.req, p)
			switch {
			case tc.status != 0 && (pp.refused == nil || pp.refused.Status != tc.status):
				t.Fatalf("refused %+v, want %d", pp.refused, tc.status)
			case tc.status == http.StatusServiceUnavailable && tc.name != "delegated, a held connection's door" && pp.refused.RetryAfter != box.MovingRetryAfter:
				t.Fatalf("Retry-After %v, want %v", pp.refused.RetryAfter, box.MovingRetryAfter)
			case tc.status == 0 && pp.refused != nil:
				t.Fatalf("refused %+v", pp.refused)
			case pp.provider != tc.provider || pp.instance != tc.instance:
				t.Fatalf("provider %q instance %v, want %q %v", pp.provider, pp.instance, tc.provider, tc.instance)
			}
			if tc.status == 404 && strings.Contains(pp.refused.Err.Error(), "fleet") {
				t.Fatalf("a stranger's 404 names a fleet: %v", pp.refused.Err)
			}
		})
	}
}

// TestSetDelegationSleepsTheSpace: a space awake here is put to sleep when its route is
// delegated (or starts moving), and its route says so.
func TestSetDelegationSleepsTheSpace(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	const host = "space.example.com"
	if _, err := b.Create(t.Context(), registry.Spec{Host: host, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	boxtest.Wake(t, b, host)
	rt, err := b.SetDelegation(t.Context(), host, box.Delegation{Provider: "partner", State: registry.ProviderDelegating})
	if err != nil || rt.Provider != "partner" || rt.ProviderState != registry.ProviderDelegating {
		t.Fatalf("SetDelegation: %+v %v", rt, err)
	}
	if boxtest.Awake(b, host) {
		t.Fatal("the space stayed awake on a box that no longer runs it")
	}
	if n := b.Delegated("partner"); n != 1 {
		t.Fatalf("Delegated = %d", n)
	}
	if _, err := b.SetDelegation(t.Context(), "none.example.com", box.Delegation{Provider: "partner"}); box.StatusOf(err) != http.StatusNotFound {
		t.Fatalf("an unknown host: %v", err)
	}
	if _, err := b.SetDelegation(t.Context(), host, box.Delegation{Provider: "Bad Name"}); box.StatusOf(err) != http.StatusBadRequest {
		t.Fatalf("a bad provider name: %v", err)
	}
}

// TestDelegatedSpaceIsNeverWokenHere: a space delegated to a provider (or moving) is not
// this box's to run: an operator's wake is refused, and a scheduled wake due in this
// fleet's bucket does not wake it (the record is dropped as a host's with no space here;
// the provider's bucket has its own).
func TestDelegatedSpaceIsNeverWokenHere(t *testing.T) {
	bkt := membucket.New()
	b := boxtest.Open(t, boxtest.Options{Bucket: bkt, WakeScan: 20 * time.Millisecond, Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	const host = "out.example.com"
	if _, err := b.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true, Provider: "partner"}); err != nil {
		t.Fatal(err)
	}
	if err := b.WakeNow(t.Context(), host); box.StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "provider partner") {
		t.Fatalf("WakeNow of a delegated space: %v, want 409 naming the provider", err)
	}
	if _, err := spacestore.PutWake(t.Context(), bkt, host, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	testwait.WaitFor(t, 10*time.Second, "the due scheduled wake dropped", func() bool {
		recs, _, err := (&spacestore.WakeScanner{Bucket: bkt}).Scan(t.Context())
		return err == nil && len(recs) == 0
	})
	if boxtest.Awake(b, host) {
		t.Fatal("a scheduled wake woke a delegated space on the fleet's box")
	}
}

// TestRemoveRefusesADelegatedRoute: removing a route delegated to a provider (or moving
// between the fleet and it) is refused with a 409 that says to reclaim it first, and
// changes nothing: the provider holds the space's only current state and its scheduled
// wakes. A hosted route (the provider's side) is removed as any route is.
func TestRemoveRefusesADelegatedRoute(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	for _, rt := range []registry.Route{
		{Host: "out.example.com", Kind: "demo", Hibernate: true, Provider: "partner"},
		{Host: "going.example.com", Kind: "demo", Hibernate: true, Provider: "partner", ProviderState: registry.ProviderDelegating},
		{Host: "coming.example.com", Kind: "demo", Hibernate: true, Provider: "partner", ProviderState: registry.ProviderReclaiming},
	} {
		if _, err := b.Registry().Put(rt); err != nil {
			t.Fatal(err)
		}
		for _, discard := range []bool{false, true} {
			err := b.Remove(t.Context(), rt.Host, discard)
			if box.StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "delegated to partner: reclaim it first") {
				t.Fatalf("Remove(%s, discard %v): %v, want 409 saying to reclaim it first", rt.Host, discard, err)
			}
			if got, err := b.Registry().Get(rt.Host); err != nil || got.Provider != "partner" || got.ProviderState != rt.ProviderState {
				t.Fatalf("after a refused Remove, %s: %+v %v", rt.Host, got, err)
			}
		}
	}
	const hosted = "hosted.example.com"
	if _, err := b.Registry().Put(registry.Route{Host: hosted, Kind: "demo", Hibernate: true, HostedFor: "fleet-a"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(t.Context(), hosted, false); err != nil {
		t.Fatalf("Remove of a hosted route: %v", err)
	}
}

// namedBucket is a bucket that describes itself as name (every membucket says "memory").
type namedBucket struct {
	bucket.Bucket
	name string
}

func (b namedBucket) String() string { return b.name }

// TestProviderMoveRefusesASpaceKeptInAnotherBucket: a space homed in a region whose spaces
// another bucket keeps (mesh.region_buckets names it, or the region's live boxes advertise
// it) is neither delegated nor reclaimed from this box, which would hand over an empty
// space or take it back where its boxes do not read it: refused, naming the bucket, the
// route unchanged. A space of this box's region goes ahead (and fails at the unreachable
// provider, put back).
func TestProviderMoveRefusesASpaceKeptInAnotherBucket(t *testing.T) {
	bkt := membucket.New()
	us, err := mesh.NewMembership(bkt, mesh.MembershipConfig{Self: boxtest.SelfB, Region: "us", Domains: []string{boxtest.Domain}, Bucket: "s3://spaces-us"})
	if err != nil {
		t.Fatal(err)
	}
	if err := us.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(us.Close)
	b := boxtest.Open(t, boxtest.Options{Bucket: bkt,
		Mesh: mesh.Config{Self: boxtest.SelfA, Domains: []string{boxtest.Domain}, Token: boxtest.Token, Region: "ie"},
		Settings: box.Settings{Kinds: boxtest.InstanceKinds(t),
			RegionBuckets: map[string]bucket.Bucket{"fi": namedBucket{membucket.New(), "s3://spaces-fi"}}}})
	testwait.WaitFor(t, 10*time.Second, "the us box live", func() bool { return slices.Contains(b.MeshStatus().Live, boxtest.SelfB) })
	side, err := b.ProviderSide()
	if err != nil {
		t.Fatal(err)
	}
	c, err := provider.NewConn(&provider.Provider{Name: "partner", URL: "https://127.0.0.1:1",
		Token: mesh.Secret(strings.Repeat("t", 40)), AcceptToken: mesh.Secret(strings.Repeat("a", 40)),
		Domains: []string{boxtest.Domain}}, provider.ConnOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rt      registry.Route
		reclaim bool
		bucket  string // named in the refusal; empty: not refused
	}{
		{registry.Route{Host: "fi-room." + boxtest.Domain, HomeRegion: "fi"}, false, "s3://spaces-fi"},
		{registry.Route{Host: "us-room." + boxtest.Domain, HomeRegion: "us"}, false, "s3://spaces-us"},
		{registry.Route{Host: "fi-out." + boxtest.Domain, HomeRegion: "fi", Provider: "partner"}, true, "s3://spaces-fi"},
		{registry.Route{Host: "us-back." + boxtest.Domain, HomeRegion: "us", Provider: "partner", ProviderState: registry.ProviderReclaiming}, true, "s3://spaces-us"},
		{registry.Route{Host: "ie-room." + boxtest.Domain, HomeRegion: "ie"}, false, ""},
	} {
		t.Run(tc.rt.Host, func(t *testing.T) {
			tc.rt.Kind, tc.rt.Hibernate = "demo", true
			if _, err := b.Registry().Put(tc.rt); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.reclaim {
				_, err = provider.Reclaim(t.Context(), side, c, tc.rt.Host, provider.Limits{})
			} else {
				_, err = provider.Delegate(t.Context(), side, c, tc.rt.Host)
			}
			if tc.bucket == "" {
				if errors.Is(err, provider.ErrMoveRefused) || !errors.Is(err, provider.ErrMoveUpstream) {
					t.Fatalf("a space of this box's region: %v, want the unreachable provider's failure", err)
				}
			} else if !errors.Is(err, provider.ErrMoveRefused) || !strings.Contains(err.Error(), tc.bucket) || !strings.Contains(err.Error(), "region "+tc.rt.HomeRegion) {
				t.Fatalf("%v, want refused naming bucket %s and region %s", err, tc.bucket, tc.rt.HomeRegion)
			}
			got, err := b.Registry().Get(tc.rt.Host)
			if err != nil || got.Provider != tc.rt.Provider || got.ProviderState != tc.rt.ProviderState {
				t.Fatalf("route after the move: %+v %v, want it unchanged", got, err)
			}
		})
	}
}

// TestHostedRouteIsHeldUntilResumed: a route a provider creates for a client fleet is
// held: its fleet's own requests get a 503 with Retry-After and an operator's wake is
// refused, so a delegation undone before the fleet's route names the provider leaves
// nothing here that runs; resumed (SetDelegation with no state), it is served.
func TestHostedRouteIsHeldUntilResumed(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	const host = "hosted.example.com"
	rt, err := b.CreateHosted(t.Context(), registry.Spec{Host: host, Kind: "demo"}, "fleet-a")
	if err != nil || rt.HostedFor != "fleet-a" || rt.ProviderState != registry.ProviderReclaiming || !rt.Hibernate {
		t.Fatalf("CreateHosted: %+v %v, want it hosted for fleet-a and held", rt, err)
	}
	req := box.Request{Host: host, Client: "fleet-a", Hops: 1}
	pp := &providerProxy{}
	b.Serve(t.Context(), req, pp)
	if pp.refused == nil || pp.refused.Status != http.StatusServiceUnavailable || pp.refused.RetryAfter != box.MovingRetryAfter || pp.instance {
		t.Fatalf("its fleet's request while held: refused %+v, instance %v; want a 503 with Retry-After", pp.refused, pp.instance)
	}
	if err := b.WakeNow(t.Context(), host); box.StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "held asleep for the fleet fleet-a") {
		t.Fatalf("WakeNow while held: %v, want a 409 saying it is held for fleet-a", err)
	}
	if _, err := b.SetDelegation(t.Context(), host, box.Delegation{}); err != nil {
		t.Fatal(err)
	}
	pp = &providerProxy{}
	b.Serve(t.Context(), req, pp)
	if pp.refused != nil || !pp.instance {
		t.Fatalf("its fleet's request once resumed: refused %+v, instance %v", pp.refused, pp.instance)
	}
}
