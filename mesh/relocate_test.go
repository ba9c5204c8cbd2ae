package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

func TestSameBucket(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"s3://x/p", "s3://x/p", true},
		{"s3://x/p", "s3://x/p at http://127.0.0.1:9000", true}, // endpoint from the env on one side
		{"s3://x/p at http://a:1", "s3://x/p at http://b:1", false},
		{"s3://x/ie", "s3://x/fi", false},
		{"s3://x", "s3://y", false},
	} {
		if got := SameBucket(tc.a, tc.b); got != tc.same {
			t.Errorf("SameBucket(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}

// namedBucket is a bucket that describes itself as name: another store than a membucket's
// "memory".
type namedBucket struct {
	bucket.Bucket
	name string
}

func (b namedBucket) String() string { return b.name }

func TestElsewhereBucket(t *testing.T) {
	const own = "s3://spaces/ie"
	fi := map[string]bucket.Bucket{"fi": namedBucket{membucket.New(), "s3://spaces/fi"}}
	sharing := map[string]bucket.Bucket{"fi": namedBucket{membucket.New(), own + " at http://127.0.0.1:9000"}}
	fiBox := []Member{{Self: "https://fi-1.example.net", Region: "fi", Bucket: "s3://spaces/fi"}}
	fiShares := []Member{{Self: "https://fi-1.example.net", Region: "fi", Bucket: own}, {Self: "https://fi-2.example.net", Region: "fi"}}
	for _, tc := range []struct {
		name, region  string
		regionBuckets map[string]bucket.Bucket
		members       []Member
		want          string
	}{
		{"no home region", "", fi, fiBox, ""},
		{"this box's region", "ie", fi, fiBox, ""},
		{"region_buckets names another", "fi", fi, nil, "s3://spaces/fi"},
		{"region_buckets names this box's", "fi", sharing, nil, ""},
		{"a live box of the region advertises another", "fi", nil, fiBox, "s3://spaces/fi"},
		{"the region's boxes share this box's, or say nothing", "fi", nil, fiShares, ""},
		{"region_buckets names this box's, its boxes another", "fi", sharing, fiBox, "s3://spaces/fi"},
		{"nothing known of the region", "us", fi, fiBox, ""},
	} {
		if got := ElsewhereBucket(tc.region, "ie", own, tc.regionBuckets, tc.members); got != tc.want {
			t.Errorf("%s: ElsewhereBucket = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// relocateFixture is two live boxes, a (this box, region ie) and b (region fi), on one
// in-memory bucket, and a hibernating space homed in ie.
type relocateFixture struct {
	bkt  *membucket.Bucket
	a, b *Membership
	reg  *registry.Registry
	r    *Relocator
	// awakeHere is what this box's engine says.
	awakeHere bool
}

const relocHost = "room.example.com"

func newRelocateFixture(t *testing.T) *relocateFixture {
	t.Helper()
	f := &relocateFixture{bkt: membucket.New()}
	f.a = newTestMember(t, f.bkt, "https://a.example.com", "ie", nil)
	f.b = newTestMember(t, f.bkt, "https://b.example.com", "fi", nil)
	for _, m := range []*Membership{f.a, f.b} {
		if err := m.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
	}
	f.a.refresh(t.Context())
	var err error
	if f.reg, err = registry.Open(filepath.Join(t.TempDir(), "reg.db"), registry.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.reg.Close() })
	if _, err := f.reg.Put(registry.Route{Host: relocHost, Kind: "demo", Hibernate: true, HomeRegion: "ie"}); err != nil {
		t.Fatal(err)
	}
	box := &Node{Self: "https://a.example.com", Domains: []string{"example.com"}, Region: "ie", Live: f.a.Live, IsDraining: f.a.Draining}
	f.r = &Relocator{
		Node: box, Bucket: f.bkt, Routes: f.reg,
		AwakeHere:  func(string) bool { return f.awakeHere },
		HolderLive: f.a.HolderLive,
	}
	return f
}

func (f *relocateFixture) lease(t *testing.T, holder, incarnation string) {
	t.Helper()
	raw, _ := json.Marshal(spacestore.Lease{Holder: holder, Incarnation: incarnation})
	if _, err := f.bkt.Put(context.Background(), spacestore.LeaseKey(relocHost), bytes.NewReader(raw), int64(len(raw)), bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
}

func (f *relocateFixture) homeRegion(t *testing.T) string {
	t.Helper()
	rt, err := f.reg.Get(relocHost)
	if err != nil {
		t.Fatal(err)
	}
	return rt.HomeRegion
}

// A relocation refuses a space awake anywhere alike, whether on this box or on a peer,
// says on which box, and changes nothing; a lease left by a dead process does not stop it.
func TestRelocateRefusesAwakeSpaceAnywhere(t *testing.T) {
	ctx := context.Background()
	req := RelocateRequest{Host: relocHost, To: "fi"}
	for _, tc := range []struct {
		name      string
		setup     func(t *testing.T, f *relocateFixture)
		wantWhere string
	}{
		{"awake on this box, waking (no lease yet)", func(t *testing.T, f *relocateFixture) { f.awakeHere = true }, "https://a.example.com"},
		{"awake on this box, its lease held", func(t *testing.T, f *relocateFixture) {
			f.lease(t, "https://a.example.com", f.a.Config().Incarnation)
		}, "https://a.example.com"},
		{"awake on a peer", func(t *testing.T, f *relocateFixture) {
			f.lease(t, "https://b.example.com", f.b.Config().Incarnation)
		}, "https://b.example.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRelocateFixture(t)
			tc.setup(t, f)
			_, err := f.r.Relocate(ctx, req)
			if !errors.Is(err, ErrRelocateRefused) {
				t.Fatalf("Relocate = %v, want ErrRelocateRefused", err)
			}
			msg := RelocateErrorMessage(err)
			if !strings.Contains(msg, relocHost+" is awake on "+tc.wantWhere) || !strings.Contains(msg, "nothing was changed") {
				t.Errorf("refusal %q does not say the space is awake on %s", msg, tc.wantWhere)
			}
			if got := f.homeRegion(t); got != "ie" {
				t.Errorf("home_region changed to %q by a refused relocation", got)
			}
		})
	}
	t.Run("a dead process's lease", func(t *testing.T) {
		f := newRelocateFixture(t)
		f.lease(t, "https://b.example.com", "an-earlier-incarnation")
		res, err := f.r.Relocate(ctx, req)
		if err != nil {
			t.Fatalf("Relocate over a dead holder's lease: %v", err)
		}
		if res.From != "ie" || res.To != "fi" || f.homeRegion(t) != "fi" {
			t.Errorf("result %+v, home_region %q", res, f.homeRegion(t))
		}
		if want := []string{"https://b.example.com"}; !slices.Equal(res.Fanout, want) {
			t.Errorf("fan-out %v, want %v (the new region's box)", res.Fanout, want)
		}
	})
}

func TestRelocateRefusesBadRequests(t *testing.T) {
	f := newRelocateFixture(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req  RelocateRequest
		kind error
	}{
		{RelocateRequest{Host: relocHost}, ErrRelocateInvalid},
		{RelocateRequest{Host: "../x", To: "fi"}, ErrRelocateInvalid},
		{RelocateRequest{Host: relocHost, To: "no such region!"}, ErrRelocateInvalid},
		{RelocateRequest{Host: "missing.example.com", To: "fi"}, ErrRelocateNotFound},
		{RelocateRequest{Host: relocHost, To: "fi", MoveDNS: true}, ErrRelocateRefused},
	} {
		if _, err := f.r.Relocate(ctx, tc.req); !errors.Is(err, tc.kind) {
			t.Errorf("Relocate(%+v) = %v, want %v", tc.req, err, tc.kind)
		}
	}
	if got := f.homeRegion(t); got != "ie" {
		t.Errorf("home_region changed to %q", got)
	}
}
