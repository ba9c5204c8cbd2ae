package mesh

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// TestMarkersAcrossSkewedClocks: two boxes whose wall clocks differ by five minutes (a
// test-only clock offset) sign and check forwarded markers against the bucket's clock,
// so each accepts the other's marker; by their wall clocks, each would strip the other's
// as stale and the request would be forwarded again.
func TestMarkersAcrossSkewedClocks(t *testing.T) {
	mem := membucket.New()
	mem.Granularity = time.Second
	skew := 5 * time.Minute
	a := newTestMember(t, mem, "https://a.example.net", "", nil)
	b := newTestMember(t, mem, "https://b.example.net", "", func(c *MembershipConfig) {
		c.WallClock = func() time.Time { return time.Now().Add(skew) }
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, m := range []*Membership{a, b} {
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer m.Close()
	}
	if d := b.BucketNow().Sub(a.BucketNow()); d > 2*time.Second || d < -2*time.Second {
		t.Fatalf("the boxes' bucket clocks differ by %v with wall clocks 5m apart, want within 2s", d)
	}
	const host = "s.example.com"
	signA := Marker{Token: "t", Now: a.BucketNow}
	checkB := Marker{Token: "t", Now: b.BucketNow}
	h := http.Header{}
	signA.Mark(h, host)
	if !checkB.Valid(h, host) {
		t.Fatal("box B refused box A's fresh marker although both read the bucket's clock")
	}
	// By the wall clocks alone the same marker is stale: what happened before.
	wallA := Marker{Token: "t", Now: time.Now}
	wallB := Marker{Token: "t", Now: func() time.Time { return time.Now().Add(skew) }}
	h = http.Header{}
	wallA.Mark(h, host)
	if wallB.Valid(h, host) {
		t.Fatal("the wall-clock check accepted a marker 5m off; the test shows nothing")
	}
}
