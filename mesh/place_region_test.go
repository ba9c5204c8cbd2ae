package mesh

import (
	"fmt"
	"testing"

	"github.com/lchat/lchat-caddy/registry"
)

// TestPlaceHomedOutsideScope: a box in ie holds a row homed in fi for a host outside its
// domains (it was created there). While fi has a live box the request goes to fi's owner
// instead of waking the space in ie; with no fi box live it goes to the box whose domains
// cover the host (it holds the row), and with none it is served here.
// The same with and without the placement cache.
func TestPlaceHomedOutsideScope(t *testing.T) {
	a := Member{Self: "https://a.mesh.test", Region: "ie", Domains: []string{"mesh.test"}}
	f1 := Member{Self: "https://f1.fi.test", Region: "fi", Domains: []string{"fi.test"}}
	f2 := Member{Self: "https://f2.fi.test", Region: "fi", Domains: []string{"fi.test"}}
	i2 := Member{Self: "https://i2.mesh.test", Region: "ie", Domains: []string{"mesh.test"}}
	o := Member{Self: "https://o.other.net", Region: "us", Domains: []string{"other.net"}}
	row := func(host, region string) *registry.Route {
		return &registry.Route{Host: host, Kind: "demo", Hibernate: true, HomeRegion: region}
	}
	// hostWith finds a host under other.net whose owner among members, homed in fi, is want.
	hostWith := func(members []Member, want string) string {
		for i := 0; i < 10000; i++ {
			h := fmt.Sprintf("x%d.other.net", i)
			if ow, ok := Owner(h, members, "fi"); ok && ow.Self == want {
				return h
			}
		}
		t.Fatalf("no host owned by %s", want)
		return ""
	}
	fiUp := []Member{a, f1, f2, i2}
	fiDown := []Member{a, i2}
	mixed := []Member{a, o}
	toO := hostWith(mixed, o.Self)
	// Placement's candidates are the boxes that hold the row: with no fi box live, a host
	// under other.net goes to o whatever it hashes to over the whole fleet.
	for i := range 200 {
		if ow, ok := Owner(fmt.Sprintf("y%d.other.net", i), mixed, "fi"); !ok || ow.Self != o.Self {
			t.Fatalf("y%d.other.net homed in fi is placed on %s, a box without its row", i, ow.Self)
		}
	}
	fiHost := hostWith(fiUp, f2.Self)
	for _, cached := range []bool{false, true} {
		for _, tc := range []struct {
			name    string
			members []Member
			req     Request
			want    Decision
			owns    bool
		}{
			{"homed in fi, fi live", fiUp, Request{Route: row(fiHost, "fi")}, Decision{Action: Forward, Peer: f2.Self, Fallback: true}, false},
			{"homed in fi, already forwarded", fiUp, Request{Route: row(fiHost, "fi"), Hops: 1}, Decision{Action: Serve}, false},
			{"homed in fi, awake here", fiUp, Request{Route: row(fiHost, "fi"), AwakeHere: true}, Decision{Action: Serve}, false},
			{"homed in fi, fi draining", []Member{a, {Self: f1.Self, Region: "fi", Domains: f1.Domains, Draining: true}, i2}, Request{Route: row(fiHost, "fi")}, Decision{Action: Serve}, true},
			{"homed in fi, no fi box, fallback owner lacks the row", fiDown, Request{Route: row(fiHost, "fi")}, Decision{Action: Serve}, true},
			{"homed in fi, no fi box, fallback owner covers the host", mixed, Request{Route: row(toO, "fi")}, Decision{Action: Forward, Peer: o.Self, Fallback: true}, false},
			{"no home region", fiUp, Request{Route: row(fiHost, "")}, Decision{Action: Serve}, true},
		} {
			members := tc.members
			b := &Node{Self: a.Self, Domains: a.Domains, Region: a.Region, Live: func() []Member { return members }}
			if cached {
				b.Placement = new(Placement)
				b.Placement.SetView(members)
			}
			if got := b.Place(tc.req); got != tc.want {
				t.Errorf("%s (cached %v): Place = %+v, want %+v", tc.name, cached, got, tc.want)
			}
			if got := b.Owns(tc.req.Route.Host, tc.req.Route.HomeRegion); got != tc.owns {
				t.Errorf("%s (cached %v): Owns = %v, want %v", tc.name, cached, got, tc.owns)
			}
		}
	}
}
