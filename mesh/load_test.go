package mesh

import (
	"context"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// TestFleetOf: the desired box count, up at once, down only past the hysteresis, the same
// from any box's copy of the listing.
func TestFleetOf(t *testing.T) {
	const gib = 1 << 30
	boxes := func(n int, warm int64) []Member {
		ms := fleet(n)
		for i := range ms {
			ms[i].Budget, ms[i].WarmSet = 10*gib, warm
		}
		return ms
	}
	a := Autoscale{Headroom: 0.2, Hysteresis: 0.1}
	tests := []struct {
		name string
		ms   []Member
		want int
	}{
		{"no budget published: 0", fleet(3), 0},
		{"an idle fleet wants one box", boxes(3, 0), 1},
		// 3×8 GiB × 1.2 / 10 GiB = 2.88 → 3: steady.
		{"steady", boxes(3, 8*gib), 3},
		// 3×9 × 1.2 / 10 = 3.24 → 4: up at once.
		{"up at once", boxes(3, 9*gib), 4},
		// 3×6.2 × 1.2 / 10 = 2.23 → 3 with headroom, 3×6.2×1.3/10 = 2.42 → 3: stays 3.
		{"not down inside the hysteresis", boxes(3, 62*gib/10), 3},
		// 3×5 × 1.3 / 10 = 1.95 → 2: down.
		{"down past it", boxes(3, 5*gib), 2},
	}
	for _, tc := range tests {
		if got := FleetOf(tc.ms, a).Desired; got != tc.want {
			t.Errorf("%s: desired %d, want %d", tc.name, got, tc.want)
		}
	}
	// A draining box counts its warm set, not as a box.
	ms := boxes(3, 8*gib)
	ms[0].Draining = true
	if f := FleetOf(ms, a); f.Boxes != 2 || f.Desired != 3 {
		t.Errorf("with one draining: %+v, want 2 boxes running and 3 desired", f)
	}
}

// TestPublishLoad: the heartbeat's load follows the measured one by steps of budget/32.
func TestPublishLoad(t *testing.T) {
	pub := Load{WarmSet: 1000 << 20, Budget: 3200 << 20, Awake: 3} // step 100 MiB
	tests := []struct {
		name     string
		measured Load
		moved    bool
	}{
		{"less than a step: kept", Load{WarmSet: 1099 << 20, Budget: 3200 << 20, Awake: 4}, false},
		{"a step up", Load{WarmSet: 1100 << 20, Budget: 3200 << 20, Awake: 4}, true},
		{"a step down", Load{WarmSet: 900 << 20, Budget: 3200 << 20, Awake: 2}, true},
		{"a new budget", Load{WarmSet: 1000 << 20, Budget: 1600 << 20, Awake: 3}, true},
		{"to empty", Load{Budget: 3200 << 20}, true},
	}
	for _, tc := range tests {
		got := PublishLoad(pub, tc.measured)
		if moved := got != pub; moved != tc.moved || moved && got != tc.measured {
			t.Errorf("%s: published %+v", tc.name, got)
		}
	}
}

// TestSizesNameTheBox: a size record names the box that wrote it, so any box that reads it
// knows where the space last woke (Placement.Last); what a box measures itself names it.
func TestSizesNameTheBox(t *testing.T) {
	ctx := context.Background()
	bkt := membucket.New()
	a := &Sizes{Bucket: bkt, Self: "https://a.example.net"}
	b := &Sizes{Bucket: bkt, Self: "https://b.example.net"}
	if err := a.Save(ctx, "room.example.com", 300*mib); err != nil {
		t.Fatal(err)
	}
	if got := b.Get(ctx, "room.example.com"); got != 300*mib {
		t.Fatalf("b reads size %d, want %d", got, 300*mib)
	}
	if got := b.Box("room.example.com"); got != a.Self {
		t.Fatalf("b reads last box %q, want %q", got, a.Self)
	}
	if rec, err := ReadSize(ctx, bkt, "room.example.com"); err != nil || rec.Box != a.Self {
		t.Fatalf("record %+v, %v: want box %q", rec, err, a.Self)
	}
	b.Note("room.example.com", 310*mib)
	if got := b.Box("room.example.com"); got != b.Self {
		t.Fatalf("after waking on b, b knows %q, want %q", got, b.Self)
	}
	// A record from a box that names none, and a host with no record: unknown.
	old := &Sizes{Bucket: bkt}
	if err := old.Save(ctx, "old.example.com", 50*mib); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"old.example.com", "none.example.com"} {
		b.Get(ctx, h)
		if got := b.Box(h); got != "" {
			t.Fatalf("%s: last box %q, want unknown", h, got)
		}
	}
}
