package mesh

import (
	"fmt"
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
