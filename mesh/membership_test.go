package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/lifecycle"
)

func newTestMember(t *testing.T, b bucket.Bucket, self, region string, mod func(*MembershipConfig)) *Membership {
	t.Helper()
	cfg := MembershipConfig{
		Self:      self,
		Region:    region,
		Domains:   []string{"example.com"},
		Version:   "test",
		Beat:      time.Second,
		DeadAfter: 3 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := NewMembership(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func selves(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Self
	}
	return out
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestMembershipDeathAndLeave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := membucket.New()
		ctx := t.Context()
		a := newTestMember(t, mem, "https://a.example.net", "", nil)
		b := newTestMember(t, mem, "https://b.example.net", "", nil)
		c := newTestMember(t, mem, "https://c.example.net", "", nil)
		for _, m := range []*Membership{a, b, c} {
			m.Start(ctx)
			defer m.Close()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := len(a.Live()); n != 3 {
			t.Fatalf("a sees %d members", n)
		}
		bInc := b.Config().Incarnation

		// b is killed: its heartbeat stays and rots. Still live at DeadAfter, dead after.
		b.Close()
		killedAt := time.Now()
		for time.Since(killedAt) < 3*time.Second {
			time.Sleep(time.Second)
			synctest.Wait()
			if !a.IsLive(b.Config().Self, bInc) {
				t.Fatalf("b dead after only %s", time.Since(killedAt))
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if a.IsLive(b.Config().Self, bInc) {
			t.Fatal("b still live 4s after its last beat with dead_after 3s")
		}
		if live, err := a.CheckLive(ctx, b.Config().Self, bInc); err != nil || live {
			t.Fatalf("CheckLive(dead b) = %v, %v", live, err)
		}

		// c drains: gone from every view at the next listing.
		if live, err := a.CheckLive(ctx, c.Config().Self, c.Config().Incarnation); err != nil || !live {
			t.Fatalf("CheckLive(c) = %v, %v", live, err)
		}
		if err := c.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		if live, _ := a.CheckLive(ctx, c.Config().Self, c.Config().Incarnation); live {
			t.Fatal("CheckLive true right after Leave")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := selves(a.Live()); !sameStrings(got, []string{"https://a.example.net"}) {
			t.Fatalf("after kill and drain a sees %v", got)
		}
	})
}

// TestMembershipFencesBeforePeersTakeOver cuts one box off from the bucket and checks
// that it fences itself, with the margin, before any peer counts it dead, and resumes
// when writes succeed again.
func TestMembershipFencesBeforePeersTakeOver(t *testing.T) {
	for _, mode := range []string{"fail", "hang"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := membucket.New()
				mem.Granularity = time.Second
				ctx := t.Context()
				cut := membucket.NewCounting(mem)
				var mu sync.Mutex
				var events []bool
				var fencedAt time.Time
				a := newTestMember(t, cut, "https://a.example.net", "", func(c *MembershipConfig) {
					c.Lifecycle = lifecycle.New()
					c.Lifecycle.OnFence(func(v bool) {
						mu.Lock()
						events = append(events, v)
						if v {
							fencedAt = time.Now()
						}
						mu.Unlock()
					})
				})
				if !a.Fenced() {
					t.Fatal("fresh membership not fenced before its first write")
				}
				peer := newTestMember(t, mem, "https://p.example.net", "", nil)
				a.Start(ctx)
				defer a.Close()
				peer.Start(ctx)
				defer peer.Close()
				if a.Fenced() {
					t.Fatal("fenced after a successful first write")
				}
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()

				// Cut the bucket off. The last successful write was sent at the 1s beat.
				lastOK := time.Now().Add(-500 * time.Millisecond)
				cut.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
					if mode == "hang" {
						<-ctx.Done() // only the op timeout ends the request
						return ctx.Err()
					}
					return errors.New("connection refused")
				})
				var peerSawDeadAt time.Time
				for i := 0; i < 100 && peerSawDeadAt.IsZero(); i++ {
					time.Sleep(100 * time.Millisecond)
					synctest.Wait()
					if !peer.IsLive(a.Config().Self, a.Config().Incarnation) {
						peerSawDeadAt = time.Now()
					}
				}
				mu.Lock()
				fa := fencedAt
				mu.Unlock()
				if fa.IsZero() || peerSawDeadAt.IsZero() {
					t.Fatalf("fenced at %v, peer saw dead at %v", fa, peerSawDeadAt)
				}
				if got := fa.Sub(lastOK); got < a.FenceAfter() || got > a.FenceAfter()+10*time.Millisecond {
					t.Fatalf("fenced %s after the last good write was sent, want %s", got, a.FenceAfter())
				}
				if margin := peerSawDeadAt.Sub(fa); margin < 500*time.Millisecond {
					t.Fatalf("fenced only %s before the peer took over", margin)
				}
				if st := a.Stats(); st.Fences != 1 || st.PutErrors == 0 {
					t.Fatalf("stats %+v", st)
				}
				// Reads failed too; a keeps its last view rather than emptying it.
				if n := len(a.Live()); n != 2 {
					t.Fatalf("a's view after failed listings has %d members, want the last view of 2", n)
				}

				cut.SetFail(nil)
				// A hung beat may still hold the slot for one op timeout, then one beat
				// writes and the peer's next listing sees it.
				time.Sleep(3 * time.Second)
				synctest.Wait()
				mu.Lock()
				got := append([]bool{}, events...)
				mu.Unlock()
				// false at the first write (Start), true when cut off, false when back.
				if len(got) != 3 || got[0] || !got[1] || got[2] || a.Fenced() {
					t.Fatalf("fence events %v (fenced now: %v), want [false true false]", got, a.Fenced())
				}
				if !peer.IsLive(a.Config().Self, a.Config().Incarnation) {
					t.Fatal("peer does not see a again")
				}
			})
		})
	}
}

func TestMembershipConfigChecks(t *testing.T) {
	mem := membucket.New()
	for _, tc := range []struct {
		name string
		cfg  MembershipConfig
	}{
		{"bad self", MembershipConfig{Self: "https://a.example.net/path"}},
		{"dead not after beat", MembershipConfig{Self: "https://a", Beat: time.Second, DeadAfter: time.Second}},
		{"margin leaves no beat", MembershipConfig{Self: "https://a", Beat: time.Second, DeadAfter: 3 * time.Second, FenceMargin: 2 * time.Second}},
	} {
		if _, err := NewMembership(mem, tc.cfg); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	m, err := NewMembership(mem, MembershipConfig{Self: "https://a"})
	if err != nil {
		t.Fatal(err)
	}
	if c := m.Config(); c.Beat != 15*time.Second || c.DeadAfter != 45*time.Second || m.FenceAfter() != 30*time.Second {
		t.Fatalf("defaults: beat %s dead %s fence after %s", c.Beat, c.DeadAfter, m.FenceAfter())
	}
}

// TestMembershipDraining: MarkDraining rewrites the heartbeat at once; peers see the flag
// at their next listing (one GET for the changed body, none after), drop the member from
// placement and fan-out, and still count it live for leases while it keeps beating.
// Leave then removes it.
func TestMembershipDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := membucket.New()
		mem.Granularity = time.Second
		counted := membucket.NewCounting(mem)
		ctx := t.Context()
		a := newTestMember(t, counted, "https://a.example.net", "", nil)
		b := newTestMember(t, mem, "https://b.example.net", "", nil)
		c := newTestMember(t, mem, "https://c.example.net", "", nil)
		for _, m := range []*Membership{a, b, c} {
			m.Start(ctx)
			defer m.Close()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		bSelf, bInc := b.Config().Self, b.Config().Incarnation
		var bHosts []string
		for i := 0; len(bHosts) < 20; i++ {
			h := fmt.Sprintf("s%d.example.com", i)
			if o, _ := Owner(h, a.Live(), ""); o.Self == bSelf {
				bHosts = append(bHosts, h)
			}
		}
		if got := selves(Targets("x.example.com", "", a.Live(), a.Config().Self)); !sameStrings(got, []string{bSelf, "https://c.example.net"}) {
			t.Fatalf("targets before the drain: %v", got)
		}

		counted.Reset()
		marked := time.Now()
		if err := b.MarkDraining(ctx); err != nil {
			t.Fatal(err)
		}
		if !b.Draining() {
			t.Fatal("Draining() false after MarkDraining")
		}
		// b stops placing spaces on itself at once.
		for _, h := range bHosts {
			if o, _ := Owner(h, b.Live(), ""); o.Self == bSelf {
				t.Fatalf("b still owns %s in its own view after MarkDraining", h)
			}
		}
		// a's next listing (within one beat) reads the changed body once.
		time.Sleep(time.Second - time.Since(marked))
		synctest.Wait()
		if got := counted.Counts()[membucket.OpGet]; got != 1 {
			t.Fatalf("a read %d heartbeat bodies after b started draining, want 1", got)
		}
		check := func(when string) {
			t.Helper()
			var seen *Member
			live := a.Live()
			for i := range live {
				if live[i].Self == bSelf {
					seen = &live[i]
				}
			}
			if seen == nil || !seen.Draining {
				t.Fatalf("%s: a's view of b = %+v, want live and draining", when, seen)
			}
			if !a.IsLive(bSelf, bInc) {
				t.Fatalf("%s: a counts draining b dead; its leases would be free mid-checkpoint", when)
			}
			if live, err := a.CheckLive(ctx, bSelf, bInc); err != nil || !live {
				t.Fatalf("%s: CheckLive(draining b) = %v, %v", when, live, err)
			}
			for _, h := range bHosts {
				if o, ok := Owner(h, live, ""); !ok || o.Self == bSelf {
					t.Fatalf("%s: %s placed on %q with b draining", when, h, o.Self)
				}
			}
			if got := selves(Targets("x.example.com", "", live, a.Config().Self)); !sameStrings(got, []string{"https://c.example.net"}) {
				t.Fatalf("%s: fan-out targets %v with b draining, want only c", when, got)
			}
		}
		check("one beat after MarkDraining")

		// b keeps beating (draining) well past dead_after; a re-reads nothing.
		counted.Reset()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		check("10s into the drain")
		if got := counted.Counts()[membucket.OpGet]; got != 0 {
			t.Fatalf("a read %d bodies during a steady drain, want 0", got)
		}
		if b.Fenced() {
			t.Fatal("draining b fenced itself though its writes succeed")
		}

		if err := b.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if a.IsLive(bSelf, bInc) {
			t.Fatal("b still live after Leave")
		}
	})
}

// TestMembershipDrainingStillFences: a box whose bucket fails while it drains gets an
// error from MarkDraining and still fences itself on schedule.
func TestMembershipDrainingStillFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := membucket.New()
		cut := membucket.NewCounting(mem)
		ctx := t.Context()
		a := newTestMember(t, cut, "https://a.example.net", "", nil)
		a.Start(ctx)
		defer a.Close()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		lastOK := time.Now().Add(-500 * time.Millisecond)
		cut.SetFail(func(ctx context.Context, op membucket.Op, key string) error { return errors.New("connection refused") })
		if err := a.MarkDraining(ctx); err == nil {
			t.Fatal("MarkDraining succeeded with the bucket down")
		}
		time.Sleep(a.FenceAfter() - time.Since(lastOK) - 10*time.Millisecond)
		synctest.Wait()
		if a.Fenced() {
			t.Fatal("fenced early")
		}
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if !a.Fenced() {
			t.Fatalf("draining box not fenced %s after its last good write", time.Since(lastOK))
		}
		// Writes succeed again: the next beat lifts the fence and writes the draining body.
		cut.SetFail(nil)
		if err := a.MarkDraining(ctx); err != nil {
			t.Fatal(err)
		}
		if a.Fenced() {
			t.Fatal("still fenced after a good write")
		}
		obj, err := mem.Get(ctx, HeartbeatKey(a.Config().Self))
		if err != nil {
			t.Fatal(err)
		}
		defer obj.Body.Close()
		var hb Heartbeat
		if err := json.NewDecoder(obj.Body).Decode(&hb); err != nil || !hb.Draining {
			t.Fatalf("stored heartbeat %+v (%v), want draining", hb, err)
		}
	})
}

// TestMembershipFresh: Fresh follows the last successful heartbeat write by the
// monotonic clock, whatever the fence timer has done: false before the first beat and
// once a beat is older than the fence time.
func TestMembershipFresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestMember(t, membucket.New(), "https://a.example.net", "", nil)
		if a.Fresh() {
			t.Fatal("fresh before its first heartbeat")
		}
		a.Start(t.Context())
		if !a.Fresh() {
			t.Fatal("not fresh right after its first heartbeat")
		}
		a.Close() // beats stop, as in a pause
		time.Sleep(1500 * time.Millisecond)
		if !a.Fresh() {
			t.Fatal("not fresh 1.5s after its last beat (fence time 2s)")
		}
		time.Sleep(time.Second)
		if a.Fresh() {
			t.Fatal("still fresh 2.5s after its last beat (fence time 2s)")
		}
	})
}
