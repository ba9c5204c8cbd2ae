package mesh

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
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

// hidingList is a store whose listings leave out one key, as a listing can while the
// object is being overwritten.
type hidingList struct {
	bucket.Bucket
	hide atomic.Value // string
}

func (h *hidingList) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	page, err := h.Bucket.List(ctx, prefix, token)
	if hide, _ := h.hide.Load().(string); hide != "" {
		kept := page.Objects[:0:0]
		for _, o := range page.Objects {
			if o.Key != hide {
				kept = append(kept, o)
			}
		}
		page.Objects = kept
	}
	return page, err
}

// hidingPair starts two members beating in one bucket, inside a synctest bubble, a reading it
// through a store whose listings can leave a key out, and lets a second pass.
func hidingPair(t *testing.T) (a, b *Membership, hiding *hidingList) {
	mem := membucket.New()
	hiding = &hidingList{Bucket: mem}
	a = newTestMember(t, hiding, "https://a.example.net", "", nil)
	b = newTestMember(t, mem, "https://b.example.net", "", nil)
	for _, m := range []*Membership{a, b} {
		m.Start(t.Context())
		t.Cleanup(m.Close)
	}
	time.Sleep(time.Second)
	synctest.Wait()
	return a, b, hiding
}

// TestCheckLiveListingMissesHeartbeat: a listing that misses a live holder's heartbeat
// does not make it dead for a takeover: the key itself is looked up.
func TestCheckLiveListingMissesHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		a, b, hiding := hidingPair(t)
		hiding.hide.Store(HeartbeatKey(b.Config().Self))
		if live, err := a.CheckLive(ctx, b.Config().Self, b.Config().Incarnation); err != nil || !live {
			t.Fatalf("CheckLive(b, missing from the listing) = %v, %v; want live", live, err)
		}
		if live, _ := a.CheckLive(ctx, b.Config().Self, "another-incarnation"); live {
			t.Fatal("an old incarnation of b counts as live")
		}
		b.Close()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if live, err := a.CheckLive(ctx, b.Config().Self, b.Config().Incarnation); err != nil || live {
			t.Fatalf("CheckLive(b, dead 5s and missing from the listing) = %v, %v; want dead", live, err)
		}
	})
}

// TestSilentFor: how long a box has not beaten, read afresh from the bucket: about nothing
// while it beats, the time since its last beat once it died (a listing that misses the
// heartbeat included), and no heartbeat at all for a box that never joined.
func TestSilentFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		a, b, hiding := hidingPair(t)
		beat := b.Config().Beat
		if d, beating, err := a.SilentFor(ctx, b.Config().Self); err != nil || !beating || d > beat {
			t.Fatalf("SilentFor(b, beating) = %v, %v, %v; want at most a beat (%v)", d, beating, err, beat)
		}
		b.Close() // killed: its last heartbeat stays
		time.Sleep(40 * time.Second)
		synctest.Wait()
		hiding.hide.Store(HeartbeatKey(b.Config().Self))
		if d, beating, err := a.SilentFor(ctx, b.Config().Self); err != nil || !beating || d < 40*time.Second || d > 40*time.Second+beat {
			t.Fatalf("SilentFor(b, dead 40 s, missing from the listing) = %v, %v, %v; want 40 s to 40 s and a beat", d, beating, err)
		}
		if d, beating, err := a.SilentFor(ctx, "https://never.example.net"); err != nil || beating {
			t.Fatalf("SilentFor(a box that never joined) = %v, %v, %v; want no heartbeat", d, beating, err)
		}
	})
}
