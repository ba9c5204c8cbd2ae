package mesh

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

func TestMembershipConvergesWithinOneBeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := membucket.New()
		mem.Granularity = time.Second // S3 timestamps
		ctx := t.Context()
		urls := []string{"https://a.example.net", "https://b.example.net", "https://c.example.net"}
		var boxes []*Membership
		for i, u := range urls {
			m := newTestMember(t, mem, u, fmt.Sprint("r", i%2), nil)
			if err := m.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			boxes = append(boxes, m)
		}
		// The first box started alone; one beat later everyone sees everyone.
		if got := selves(boxes[0].Live()); !sameStrings(got, urls[:1]) {
			t.Fatalf("first box before a beat sees %v", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for i, b := range boxes {
			live := b.Live()
			if got := selves(live); !sameStrings(got, urls) {
				t.Fatalf("box %d sees %v, want %v", i, got, urls)
			}
			for _, m := range live {
				if m.Region == "" || len(m.Domains) != 1 || m.Incarnation == "" || m.Version != "test" {
					t.Fatalf("box %d: member body not read: %+v", i, m)
				}
				if m.Age < 0 || m.Age > 2*time.Second {
					t.Fatalf("box %d: member %s age %s", i, m.Self, m.Age)
				}
			}
			if b.Fenced() {
				t.Fatalf("box %d fenced while healthy", i)
			}
		}
		// Every box computes the same owners from its own view.
		for i := 0; i < 200; i++ {
			host := fmt.Sprintf("s%d.example.com", i)
			o0, _ := Owner(host, boxes[0].Live(), "r1")
			for _, b := range boxes[1:] {
				if o, _ := Owner(host, b.Live(), "r1"); o.Self != o0.Self {
					t.Fatalf("%s: owners disagree: %s vs %s", host, o.Self, o0.Self)
				}
			}
			if o0.Region != "r1" {
				t.Fatalf("%s placed on region %q, want r1", host, o0.Region)
			}
		}
	})
}

func TestMembershipSteadyStateCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := membucket.New()
		counted := membucket.NewCounting(mem)
		ctx := t.Context()
		peer := newTestMember(t, mem, "https://peer.example.net", "", nil)
		peer.Start(ctx)
		defer peer.Close()
		m := newTestMember(t, counted, "https://me.example.net", "", nil)
		m.Start(ctx)
		defer m.Close()
		time.Sleep(time.Second) // first full beat reads the peer's body once
		synctest.Wait()
		counted.Reset()
		const beats = 100
		time.Sleep(beats * time.Second)
		synctest.Wait()
		c := counted.Counts()
		if c[membucket.OpPut] != beats || c[membucket.OpList] != beats || c[membucket.OpGet] != 0 || counted.Total() != 2*beats {
			t.Fatalf("over %d beats: %v, want %d PUT + %d LIST and nothing else", beats, c, beats, beats)
		}
		// A restarted peer (new incarnation, new body, new ETag) is read exactly once.
		peer.Close()
		peer2 := newTestMember(t, mem, "https://peer.example.net", "", nil)
		peer2.Start(ctx)
		defer peer2.Close()
		counted.Reset()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := counted.Counts()[membucket.OpGet]; got != 1 {
			t.Fatalf("restarted peer read %d times, want 1", got)
		}
		if !m.IsLive("https://peer.example.net", peer2.Config().Incarnation) || m.IsLive("https://peer.example.net", peer.Config().Incarnation) {
			t.Fatal("IsLive does not follow the peer's incarnation")
		}
	})
}

// TestMembershipLivenessByBucketClock: liveness compares a heartbeat's LastModified with
// the listing's own time, both from the store, so a store whose clock is an hour off the
// boxes' changes nothing: members are live at once, and a killed one dies after
// dead_after, not an hour early or an hour late.
func TestMembershipLivenessByBucketClock(t *testing.T) {
	for _, off := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(off.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := membucket.New()
				mem.Granularity = time.Second
				mem.Offset = off
				ctx := t.Context()
				a := newTestMember(t, mem, "https://a.example.net", "", nil)
				b := newTestMember(t, mem, "https://b.example.net", "", nil)
				for _, m := range []*Membership{a, b} {
					m.Start(ctx)
					defer m.Close()
				}
				time.Sleep(time.Second)
				synctest.Wait()
				live := a.Live()
				if got := selves(live); !sameStrings(got, []string{"https://a.example.net", "https://b.example.net"}) {
					t.Fatalf("store clock %v off: a sees %v", off, got)
				}
				for _, m := range live {
					if m.Age < 0 || m.Age > 2*time.Second {
						t.Fatalf("store clock %v off: %s has age %v", off, m.Self, m.Age)
					}
				}
				b.Close()
				killed := time.Now()
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if !a.IsLive(b.Config().Self, b.Config().Incarnation) {
					t.Fatalf("store clock %v off: b dead %v after its last beat (dead_after 3s)", off, time.Since(killed))
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if a.IsLive(b.Config().Self, b.Config().Incarnation) {
					t.Fatalf("store clock %v off: b still live %v after its last beat (dead_after 3s)", off, time.Since(killed))
				}
				if st := a.Stats(); st.ClockFallbacks != 0 {
					t.Fatalf("fell back to the local clock %d times", st.ClockFallbacks)
				}
			})
		})
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
