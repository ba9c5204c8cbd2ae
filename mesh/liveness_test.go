package mesh

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

func TestLiveIn(t *testing.T) {
	members := []Member{{Self: "https://a.test", Incarnation: "1"}, {Self: "https://b.test"}}
	live := LiveIn(members)
	for _, tc := range []struct {
		holder, inc string
		want        bool
	}{
		{"https://a.test", "1", true},
		{"https://a.test", "0", false}, // an earlier process of a live box
		{"https://b.test", "", false},  // no incarnation holds nothing
		{"https://c.test", "1", false},
	} {
		if got := live(tc.holder, tc.inc); got != tc.want {
			t.Errorf("live(%s, %q) = %v, want %v", tc.holder, tc.inc, got, tc.want)
		}
	}
}

// ReadMembers is the membership's own reader: it pages past a listing page, judges age
// by the bucket's clock (a box whose clock is off changes nothing), and reads bodies.
func TestReadMembers(t *testing.T) {
	ctx := context.Background()
	bkt := membucket.New()
	bkt.PageSize = 2
	var ms []*Membership
	for _, self := range []string{"https://a.test", "https://b.test", "https://c.test"} {
		m := newTestMember(t, bkt, self, "fi", nil)
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		ms = append(ms, m)
	}
	got, err := ReadMembers(ctx, bkt, 3*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1].Self != "https://b.test" || got[1].Incarnation != ms[1].Config().Incarnation || got[1].Region != "fi" {
		t.Fatalf("ReadMembers = %+v", got)
	}
	// The bucket's clock runs a minute ahead: every heartbeat is dead by it.
	bkt.Offset = time.Minute
	ms[0].Close()
	if got, err := ReadMembers(ctx, bkt, 3*time.Second, time.Second); err != nil || len(got) != 0 {
		t.Fatalf("with every heartbeat a minute old by the bucket's clock: %+v, %v", got, err)
	}
	cut := membucket.NewCounting(bkt)
	cut.SetFail(func(context.Context, membucket.Op, string) error { return errors.New("connection refused") })
	if _, err := ReadMembers(ctx, cut, 3*time.Second, time.Second); err == nil {
		t.Fatal("a failed listing read as an empty fleet")
	}
}

// HolderLive believes a view that says live, confirms one that says dead with a fresh
// read, and counts a holder live when it cannot tell.
func TestHolderLive(t *testing.T) {
	ctx := context.Background()
	bkt := membucket.New()
	cut := membucket.NewCounting(bkt)
	a := newTestMember(t, cut, "https://a.test", "", nil)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	// b joins after a's last listing: a's view says dead, the bucket says live.
	b := newTestMember(t, bkt, "https://b.test", "", nil)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if a.IsLive("https://b.test", b.Config().Incarnation) {
		t.Skip("a's view already has b")
	}
	if !a.HolderLive("https://b.test", b.Config().Incarnation) {
		t.Error("a holder live in the bucket but not yet in the view counted dead: its lease could be stolen")
	}
	if a.HolderLive("https://b.test", "an-earlier-incarnation") {
		t.Error("an earlier incarnation counted live")
	}
	cut.SetFail(func(context.Context, membucket.Op, string) error { return errors.New("connection refused") })
	if !a.HolderLive("https://c.test", "x") {
		t.Error("a holder counted dead although the bucket could not be read")
	}
}
