package lchatcli

import (
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/fleetview"
)

// status's STATE: awake wherever a box of the fleet runs the space, asleep when none
// does, live for a route without hibernation.
func TestStatusTable(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	spaces := []box.SpaceReport{
		{Space: fleetview.Space{Host: "a.localhost", Kind: "demo", Hibernate: true, State: "awake", AwakeOn: []string{"box1"}, FleetConns: &fleetview.Conns{Open: 2, Streams: 1}},
			Stored: &fleetview.Stored{Generation: 7, WrittenAt: now.Add(-90 * time.Second)}},
		{Space: fleetview.Space{Host: "b.localhost", Kind: "demo", Hibernate: true, AwakeOn: []string{"box2"}}},
		{Space: fleetview.Space{Host: "c.localhost", Kind: "demo", Hibernate: true, State: "asleep"}},
		{Space: fleetview.Space{Host: "d.localhost", Kind: "demo", Hibernate: true}},
		{Space: fleetview.Space{Host: "e.localhost", Kind: "demo", Hibernate: true, State: "failed"}},
		{Space: fleetview.Space{Host: "f.localhost", Hibernate: false}},
	}
	var b strings.Builder
	printStatus(&b, spaces, now)
	want := []string{
		"HOST         KIND  STATE   BOX   LAST CHECKPOINT    HELD",
		"a.localhost  demo  awake   box1  1m30s ago (gen 7)  3",
		"b.localhost  demo  awake   box2  -                  -",
		"c.localhost  demo  asleep  -     -                  -",
		"d.localhost  demo  asleep  -     -                  -",
		"e.localhost  demo  failed  -     -                  -",
		"f.localhost  -     live    -     -                  -",
	}
	if got := strings.Split(strings.TrimSpace(b.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("status printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
