package connhold

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// remoteApp is a Deliverer standing for instances on other boxes: each event goes to the
// instance now says, which refuses it (ReplayError) when an earlier unsaved
// acknowledgement was another's, as a peer does.
type remoteApp struct {
	*fakeApp
	mu   sync.Mutex
	now  At
	mark uint64
}

func (r *remoteApp) Deliver(ctx context.Context, ev Event) (Reply, error) {
	r.mu.Lock()
	now := r.now
	r.mu.Unlock()
	if stale := StaleAt(ev.Prior, now); len(stale) > 0 {
		return Reply{}, &ReplayError{Stale: stale}
	}
	rep, err := r.fakeApp.Deliver(ctx, ev)
	if err != nil {
		return rep, err
	}
	r.mu.Lock()
	r.mark++
	rep.At, rep.Mark = now, r.mark
	r.mu.Unlock()
	return rep, nil
}

func (r *remoteApp) move(to At) {
	r.mu.Lock()
	r.now, r.mark = to, 0
	r.mu.Unlock()
}

func newRemoteBox(t *testing.T, first At) (*testBox, *remoteApp) {
	tb := newTestBox(t, Limits{}, false)
	ra := &remoteApp{fakeApp: newFakeApp(), now: first}
	tb.hub.d = ra
	tb.app = ra.fakeApp
	return tb, ra
}

// A message acknowledged by an instance on another box, which then ended with no
// checkpoint known to hold it, reaches the next instance again before any later one,
// with its sequence number, marked as a redelivery.
func TestMovedSpaceGetsUnsavedMessagesFirst(t *testing.T) {
	b := At{Box: "https://b", Incarnation: "i1", Instance: "10@1"}
	cbox := At{Box: "https://c", Incarnation: "i2", Instance: "20@2"}
	tb, ra := newRemoteBox(t, b)
	conn := tb.dial(t, nil)
	write(t, conn, "one")
	testwait.WaitFor(t, 10*time.Second, "one acknowledged at b", func() bool { return tb.hub.Stats().Delivered == 1 })
	ra.move(cbox) // b died; the space wakes on c
	write(t, conn, "two")
	testwait.WaitFor(t, 10*time.Second, "two delivered", func() bool { return tb.hub.Stats().Delivered == 3 })
	evs := tb.app.all()
	got := make([]string, 0, len(evs))
	for _, ev := range evs {
		got = append(got, string(ev.Payload)+map[bool]string{true: "*", false: ""}[ev.Redelivery])
	}
	if !slices.Equal(got, []string{"one", "one*", "two"}) {
		t.Fatalf("the instances saw %q, want one, one again (redelivered) before two", got)
	}
	if evs[1].Seq != 1 || evs[2].Seq != 2 {
		t.Errorf("sequence numbers %d, %d: want 1, 2", evs[1].Seq, evs[2].Seq)
	}
	if n := tb.hub.Stats().Replayed; n != 1 {
		t.Errorf("Replayed = %d, want 1", n)
	}
}

// What another box's checkpoint covers is dropped; what its instance ended without
// saving is delivered again; a box that left the mesh is taken as ended.
func TestRemoteNoticesCoverAndReplay(t *testing.T) {
	b := At{Box: "https://b", Incarnation: "i1", Instance: "10@1"}
	tb, _ := newRemoteBox(t, b)
	conn := tb.dial(t, nil)
	for _, m := range []string{"a", "b", "c"} {
		write(t, conn, m)
	}
	testwait.WaitFor(t, 10*time.Second, "three acknowledged", func() bool { return tb.hub.Stats().Delivered == 3 })
	// A local checkpoint never covers another box's acknowledgements.
	tb.hub.CheckpointCovered("s1", time.Now().Add(time.Hour))
	tb.hub.CheckpointDone("s1", tb.hub.CheckpointStarted("s1"))
	if l := tb.hub.List("s1", ""); l[0].Pending != 3 {
		t.Fatalf("after a local checkpoint %d pending, want 3", l[0].Pending)
	}
	tb.hub.RemoteCovered("s1", b, 2)
	if l := tb.hub.List("s1", ""); l[0].Pending != 1 {
		t.Fatalf("after b's checkpoint covered marks 1-2: %d pending, want 1", l[0].Pending)
	}
	if got := tb.hub.RemoteBoxes(); len(got) != 1 || got[0] != [2]string{b.Box, b.Incarnation} {
		t.Fatalf("RemoteBoxes = %v", got)
	}
	if n := tb.hub.BoxGone(b.Box, b.Incarnation); n != 1 {
		t.Fatalf("BoxGone replayed %d, want 1", n)
	}
	testwait.WaitFor(t, 10*time.Second, "c delivered again", func() bool { return len(tb.app.all()) == 4 })
	if ev := tb.app.all()[3]; string(ev.Payload) != "c" || ev.Seq != 3 || !ev.Redelivery {
		t.Errorf("redelivery %+v, want c seq 3", ev)
	}
	// RemoteGone: covered up to its mark, the rest again.
	tb.hub.RemoteGone("s1", b, 1) // c's new mark is 4 (this fake numbers on)
	testwait.WaitFor(t, 10*time.Second, "c delivered a third time", func() bool { return len(tb.app.all()) == 5 })
}

func TestRelayMarksCoverAndEnd(t *testing.T) {
	var r Relay
	at := At{Box: "https://b", Incarnation: "i", Instance: "1@1"}
	t0 := time.Now()
	for i := range 3 {
		if m, _ := r.Acked("s", at, "https://a", t0.Add(time.Duration(i)*time.Second)); m != uint64(i+1) {
			t.Fatalf("mark %d, want %d", m, i+1)
		}
	}
	r.Track("s", at, "https://c")
	n, entries, ok := r.Checkpointed("s", t0.Add(1500*time.Millisecond))
	if !ok || n.Covered != 2 || n.Gone || !slices.Equal(entries, []string{"https://a", "https://c"}) {
		t.Fatalf("checkpoint notice %+v to %v (%v), want covered 2 to a and c", n, entries, ok)
	}
	if _, cov := r.Acked("s", at, "https://a", t0.Add(4*time.Second)); cov != 2 {
		t.Errorf("an answer after it carries covered %d, want 2", cov)
	}
	if _, _, ok := r.Checkpointed("s", t0); ok {
		t.Errorf("an older checkpoint told something new")
	}
	n, _, ok = r.Ended("s", false)
	if !ok || !n.Gone || n.Covered != 2 {
		t.Fatalf("crash notice %+v, want gone above 2", n)
	}
	if _, _, ok := r.Ended("s", true); ok {
		t.Errorf("an ended space was told twice")
	}
	r.Acked("s", at, "https://a", t0)
	if n, _, _ := r.Ended("s", true); n.Gone || n.Covered != 1 {
		t.Errorf("sleep notice %+v, want everything (1) covered", n)
	}
	if got, err := ParseAt(at.String()); err != nil || got != at {
		t.Errorf("ParseAt(String) = %v, %v", got, err)
	}
	if _, err := ParseAt("only two"); err == nil {
		t.Errorf("ParseAt took two fields")
	}
}

// checkCounts compares c's kept counts of its acknowledged messages (ackedN, ackedBytes,
// priors, scan) with a walk of pending.
func checkCounts(t *testing.T, c *Conn) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n, bytes := 0, 0
	var prior []At
	for i, pm := range c.pending {
		if !pm.acked {
			if i < c.scan {
				t.Errorf("message %d (seq %d) is not acknowledged, below scan %d", i, pm.seq, c.scan)
			}
			continue
		}
		n++
		bytes += len(pm.payload)
		if !pm.at.IsZero() && !slices.Contains(prior, pm.at) {
			prior = append(prior, pm.at)
		}
	}
	got := c.priorLocked()
	slices.SortFunc(got, func(a, b At) int { return strings.Compare(a.String(), b.String()) })
	slices.SortFunc(prior, func(a, b At) int { return strings.Compare(a.String(), b.String()) })
	if n != c.ackedN || bytes != c.ackedBytes || !slices.Equal(got, prior) {
		t.Errorf("kept counts: %d acknowledged, %d bytes, prior %v; pending says %d, %d, %v",
			c.ackedN, c.ackedBytes, got, n, bytes, prior)
	}
}

// The counts an event reads instead of walking the backlog (how many acknowledged, their
// bytes, the instances in Event.Prior) stay what the backlog says through moves,
// replays, local and remote checkpoints and a box that left.
func TestAcknowledgedCountsFollowTheBacklog(t *testing.T) {
	b := At{Box: "https://b", Incarnation: "i1", Instance: "10@1"}
	cb := At{Box: "https://c", Incarnation: "i2", Instance: "20@2"}
	tb, ra := newRemoteBox(t, b)
	ws := tb.dial(t, nil)
	var c *Conn
	testwait.WaitFor(t, 10*time.Second, "the connection held", func() bool {
		all := tb.hub.allConns()
		c = nil
		if len(all) == 1 {
			c = all[0]
		}
		return c != nil
	})
	delivered := func(n uint64) {
		t.Helper()
		testwait.WaitFor(t, 10*time.Second, fmt.Sprintf("%d delivered", n), func() bool { return tb.hub.Stats().Delivered == n })
		checkCounts(t, c)
	}
	for _, m := range []string{"a", "bb", "ccc"} {
		write(t, ws, m)
	}
	delivered(3)
	if p := tb.app.all()[2].Prior; !slices.Equal(p, []At{b}) {
		t.Errorf("third event's Prior %v, want [b]", p)
	}
	ra.move(cb) // the next event is refused until a, bb, ccc are delivered again at c
	write(t, ws, "dddd")
	delivered(7)
	tb.hub.RemoteCovered("s1", cb, 2)
	checkCounts(t, c)
	if l := tb.hub.List("s1", ""); l[0].Pending != 2 {
		t.Fatalf("after c covered marks 1-2: %d pending, want 2", l[0].Pending)
	}
	tb.hub.BoxGone(cb.Box, cb.Incarnation)
	delivered(9)
	tb.hub.RemoteGone("s1", cb, 100)
	checkCounts(t, c)
	if l := tb.hub.List("s1", ""); l[0].Pending != 0 {
		t.Fatalf("after c covered everything: %d pending, want 0", l[0].Pending)
	}
	write(t, ws, "e")
	delivered(10)
	if p := tb.app.all()[len(tb.app.all())-1].Prior; len(p) != 0 {
		t.Errorf("after everything was covered, Prior %v, want none", p)
	}
}
