package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestCatchUpPlan(t *testing.T) {
	peer := Member{Self: "https://b.mesh.test", Domains: []string{"mesh.test"}, Region: "fi"}
	row := func(host, rev string) RouteRow { return RouteRow{Host: host, Kind: "demo", Hibernate: true, Rev: rev} }
	homed := func(host, region, rev string) RouteRow {
		r := row(host, rev)
		r.HomeRegion = region
		return r
	}
	local := []RouteRow{
		row("missing.mesh.test", "0000000000000002-a"),        // the peer lacks it: put
		row("older.mesh.test", "0000000000000005-a"),          // the peer lists it older: put
		row("newer.mesh.test", "0000000000000005-a"),          // the peer has a newer one: kept
		row("same.mesh.test", "0000000000000005-a"),           // same revision: nothing
		row("outside.other.test", "0000000000000005-a"),       // outside the peer's scope: nothing
		homed("homed.other.test", "fi", "0000000000000005-a"), // homed in the peer's region: put
	}
	tombs := map[string]string{
		"deleted.mesh.test":   "0000000000000009-a", // the peer lists it older: tombstone
		"recreated.mesh.test": "0000000000000003-a", // the peer re-created it since: kept
		"gone.mesh.test":      "0000000000000003-a", // the peer lists none: nothing
	}
	listed := []RouteRow{
		row("older.mesh.test", "0000000000000004-a"),
		row("newer.mesh.test", "0000000000000006-b"),
		row("same.mesh.test", "0000000000000005-a"),
		row("deleted.mesh.test", "0000000000000008-b"),
		row("recreated.mesh.test", "0000000000000004-b"),
	}
	puts, tombstones := CatchUpPlan(local, tombs, listed, peer, time.Unix(0, 0))
	var got []string
	for _, p := range puts {
		got = append(got, p.Host)
	}
	if want := "[homed.other.test missing.mesh.test older.mesh.test]"; fmt.Sprint(got) != want {
		t.Errorf("puts %v, want %s", got, want)
	}
	if want := "[{deleted.mesh.test 0000000000000009-a}]"; fmt.Sprint(tombstones) != want {
		t.Errorf("tombstones %v, want %s", tombstones, want)
	}
	// A peer that lists everything this box has, at the same revisions, needs nothing.
	puts, tombstones = CatchUpPlan(local[3:4], nil, listed, peer, time.Unix(0, 0))
	if len(puts)+len(tombstones) != 0 {
		t.Errorf("an up-to-date peer got %v %v", puts, tombstones)
	}
	// Past the tombstone horizon, a row the peer lacks stays away (the peer may have
	// deleted it and forgotten the tombstone); one the peer lists older is still updated.
	old := fmt.Sprintf("%016x-a", uint64(time.Now().Add(-8*24*time.Hour).UnixMilli())<<16)
	older := fmt.Sprintf("%016x-a", uint64(time.Now().Add(-9*24*time.Hour).UnixMilli())<<16)
	recent := fmt.Sprintf("%016x-a", uint64(time.Now().Add(-time.Hour).UnixMilli())<<16)
	puts, _ = CatchUpPlan([]RouteRow{row("ancient.mesh.test", old), row("stale.mesh.test", old), row("fresh.mesh.test", recent)}, nil,
		[]RouteRow{row("stale.mesh.test", older)}, peer, time.Now().Add(-7*24*time.Hour))
	got = got[:0]
	for _, p := range puts {
		got = append(got, p.Host)
	}
	if want := "[fresh.mesh.test stale.mesh.test]"; fmt.Sprint(got) != want {
		t.Errorf("puts with a 7-day horizon %v, want %s", got, want)
	}
}

// fakePeer is a CatchUpPeer in memory: its listing, what it was sent, and failures to
// give first.
type fakePeer struct {
	mu       sync.Mutex
	listed   []RouteRow
	failList int
	put      []string
}

func (p *fakePeer) ListRoutes(context.Context, string) ([]RouteRow, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failList > 0 {
		p.failList--
		return nil, errors.New("connection refused")
	}
	return p.listed, nil
}

func (p *fakePeer) PutRoute(_ context.Context, _ string, row RouteRow) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.put = append(p.put, row.Host)
	p.listed = append(p.listed, row)
	return nil
}

func (p *fakePeer) DeleteRoute(context.Context, string, string, string) error { return nil }

// TestCatchUpTick: a peer is caught up once per incarnation (again after it restarts),
// a failed catch-up is tried again at the next tick, and the rotation catches a peer up
// again even without a restart.
func TestCatchUpTick(t *testing.T) {
	inc := "1"
	var mu sync.Mutex
	live := func() []Member {
		mu.Lock()
		defer mu.Unlock()
		return []Member{{Self: "https://a.mesh.test"}, {Self: "https://b.mesh.test", Domains: []string{"mesh.test"}, Incarnation: inc}}
	}
	peer := &fakePeer{failList: 1}
	rev := fmt.Sprintf("%016x-a", uint64(time.Now().UnixMilli())<<16)
	c := &CatchUp{Node: &Node{Self: "https://a.mesh.test", Live: live}, Peer: peer,
		Rows: func() ([]RouteRow, error) {
			return []RouteRow{{Host: "x.mesh.test", Kind: "demo", Hibernate: true, Rev: rev}}, nil
		},
		Tombs: func() map[string]string { return nil }}
	ctx := context.Background()
	tick := func(rotate bool, wantRuns uint64) {
		t.Helper()
		c.Tick(ctx, rotate)
		deadline := time.Now().Add(5 * time.Second)
		busy := func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.running) > 0
		}
		for c.Stats().Runs < wantRuns || busy() {
			if time.Now().After(deadline) {
				t.Fatalf("runs %d, want %d", c.Stats().Runs, wantRuns)
			}
			time.Sleep(time.Millisecond)
		}
	}
	tick(false, 1) // the listing fails
	if st := c.Stats(); st.Failures != 1 || st.Puts != 0 {
		t.Fatalf("after a failed listing: %+v", st)
	}
	tick(false, 2) // tried again: the row goes over
	tick(false, 2) // caught up: nothing to do at the same incarnation
	if st := c.Stats(); st.Runs != 2 || st.Puts != 1 || fmt.Sprint(peer.put) != "[x.mesh.test]" {
		t.Fatalf("after a catch-up: %+v, sent %v", st, peer.put)
	}
	mu.Lock()
	inc = "2" // the peer restarted
	mu.Unlock()
	tick(false, 3)
	tick(true, 4) // the rotation looks again anyway
	if st := c.Stats(); st.Puts != 1 {
		t.Fatalf("a peer that already has the row got it again: %+v", st)
	}
}
