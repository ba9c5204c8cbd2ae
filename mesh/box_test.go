package mesh

import (
	"errors"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/registry"
)

func testBox(members ...Member) *Box {
	return &Box{
		Self:    "https://a.mesh.test",
		Domains: []string{"mesh.test"},
		Region:  "fi",
		Live:    func() []Member { return members },
	}
}

func allow(*registry.Route) error { return nil }

func TestAcceptRow(t *testing.T) {
	b := testBox(Member{Self: "https://a.mesh.test"}, Member{Self: "https://b.mesh.test"})
	served := &registry.Route{Host: "live.mesh.test", Upstream: "127.0.0.1:9"}
	pinned := &registry.Route{Host: "live.mesh.test", LivesAt: "https://b.mesh.test"}
	noKind := func(rt *registry.Route) error { return errors.New("kind \"chat\" is not configured on this box") }
	for _, tc := range []struct {
		name     string
		row      RouteRow
		prev     *registry.Route
		check    func(*registry.Route) error
		want     string // "" accepted, "kept", or a substring of the refusal
		conflict bool
	}{
		{"in domains", RouteRow{Host: "x.mesh.test", Kind: "demo", Hibernate: true}, nil, allow, "", false},
		{"homed in this region", RouteRow{Host: "x.other.net", Kind: "demo", Hibernate: true, HomeRegion: "fi"}, nil, allow, "", false},
		{"out of scope", RouteRow{Host: "x.other.net", Kind: "demo", Hibernate: true, HomeRegion: "ie"}, nil, allow, "outside this box's mesh domains", false},
		{"pinned to this box", RouteRow{Host: "live.mesh.test", Kind: "demo", LivesAt: "https://a.mesh.test"}, nil, allow, "kept", false},
		{"pinned to a live peer", RouteRow{Host: "live.mesh.test", Kind: "demo", LivesAt: "https://b.mesh.test"}, pinned, allow, "", false},
		{"pinned to no box of the mesh", RouteRow{Host: "live.mesh.test", Kind: "demo", LivesAt: "http://169.254.169.254"}, nil, allow, "not a live box of this mesh", true},
		{"kind not configured", RouteRow{Host: "x.mesh.test", Kind: "chat", Hibernate: true}, nil, noKind, "not configured", false},
		{"over a live route served here", RouteRow{Host: "live.mesh.test", Kind: "demo", LivesAt: "https://b.mesh.test"}, served, allow, "served by this box", true},
		{"hibernating over a live route served here", RouteRow{Host: "live.mesh.test", Kind: "demo", Hibernate: true}, served, allow, "served by this box", true},
	} {
		rt, err := b.AcceptRow(tc.row, tc.prev, tc.check)
		switch {
		case tc.want == "":
			if err != nil || rt.Host != tc.row.Host || rt.LivesAt != tc.row.LivesAt || rt.Upstream != "" {
				t.Errorf("%s: AcceptRow = %+v, %v; want stored", tc.name, rt, err)
			}
		case tc.want == "kept":
			if !errors.Is(err, ErrKept) {
				t.Errorf("%s: AcceptRow = %v, want ErrKept", tc.name, err)
			}
		default:
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.want) || re.Conflict != tc.conflict {
				t.Errorf("%s: AcceptRow = %v, want a refusal (conflict %v) saying %q", tc.name, err, tc.conflict, tc.want)
			}
		}
	}
}

func TestAcceptTombstone(t *testing.T) {
	b := testBox()
	for _, tc := range []struct {
		name string
		host string
		prev *registry.Route
		want string
	}{
		{"in domains", "x.mesh.test", nil, ""},
		{"homed here by its stored row", "x.other.net", &registry.Route{Host: "x.other.net", Hibernate: true, Kind: "demo", HomeRegion: "fi"}, ""},
		{"out of scope", "x.other.net", nil, "outside"},
		{"a live route served here", "x.mesh.test", &registry.Route{Host: "x.mesh.test", Upstream: "127.0.0.1:9"}, "served by this box"},
		{"invalid host", "../x", nil, "path"},
	} {
		err := b.AcceptTombstone(tc.host, tc.prev)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(strings.ToLower(err.Error()), tc.want)) {
			t.Errorf("%s: AcceptTombstone = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// ownerOf returns the HRW owner of host among members, and a host owned by other.
func hostOwnedBy(t *testing.T, members []Member, want string) string {
	t.Helper()
	for i := range 1000 {
		h := "s" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + ".mesh.test"
		h = strings.ReplaceAll(h, "x", string(rune('a'+(i/26)%26)))
		if o, ok := Owner(h, members, ""); ok && o.Self == want {
			return h
		}
	}
	t.Fatalf("no host owned by %s", want)
	return ""
}

func TestPlace(t *testing.T) {
	members := []Member{{Self: "https://a.mesh.test"}, {Self: "https://b.mesh.test"}, {Self: "https://c.mesh.test"}}
	b := testBox(members...)
	draining := false
	b.Draining = func() bool { return draining }
	mine := hostOwnedBy(t, members, "https://a.mesh.test")
	theirs := hostOwnedBy(t, members, "https://b.mesh.test")
	hib := func(h string) *registry.Route { return &registry.Route{Host: h, Kind: "demo", Hibernate: true} }
	for _, tc := range []struct {
		name     string
		req      Request
		draining bool
		want     Decision
	}{
		{"owned here", Request{Route: hib(mine)}, false, Decision{Action: Serve}},
		{"owned by a peer", Request{Route: hib(theirs)}, false, Decision{Action: Forward, Peer: "https://b.mesh.test", Fallback: true}},
		{"owned by a peer, awake here", Request{Route: hib(theirs), AwakeHere: true}, false, Decision{Action: Serve}},
		{"awake here while draining", Request{Route: hib(theirs), AwakeHere: true}, true, Decision{Action: Forward, Peer: "https://b.mesh.test", Fallback: true}},
		{"already forwarded", Request{Route: hib(theirs), Forwarded: true}, false, Decision{Action: Serve}},
		{"outside the mesh", Request{Route: hib("x.other.net")}, false, Decision{Action: Serve}},
		{"live route here", Request{Route: &registry.Route{Host: "l.mesh.test", Upstream: "127.0.0.1:9"}}, false, Decision{Action: Serve}},
		{"live route pinned to a peer", Request{Route: &registry.Route{Host: "l.mesh.test", LivesAt: "https://c.mesh.test"}}, false, Decision{Action: Forward, Peer: "https://c.mesh.test"}},
		{"live route pinned to this box", Request{Route: &registry.Route{Host: "l.mesh.test", LivesAt: "https://a.mesh.test"}}, false, Decision{Action: Serve}},
	} {
		draining = tc.draining
		if got := b.Place(tc.req); got != tc.want {
			t.Errorf("%s: Place = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	draining = false
	loop := b.Place(Request{Route: &registry.Route{Host: "l.mesh.test", LivesAt: "https://c.mesh.test"}, Forwarded: true})
	if loop.Action != Unavailable || !strings.Contains(loop.Reason, "already forwarded") {
		t.Errorf("a forwarded request for a route pinned elsewhere: %+v, want unavailable", loop)
	}
}

func TestLeaseHeld(t *testing.T) {
	b := testBox()
	if d := b.LeaseHeld("x.mesh.test", "https://b.mesh.test", false); d != (Decision{Action: Forward, Peer: "https://b.mesh.test"}) {
		t.Errorf("held by a peer: %+v, want a forward to it", d)
	}
	for name, d := range map[string]Decision{
		"already forwarded": b.LeaseHeld("x.mesh.test", "https://b.mesh.test", true),
		"held by this box":  b.LeaseHeld("x.mesh.test", "https://a.mesh.test", false),
		"not a mesh box":    b.LeaseHeld("x.mesh.test", "box:1234", false),
	} {
		if d.Action != Unavailable {
			t.Errorf("%s: %+v, want unavailable", name, d)
		}
	}
}

func TestOwns(t *testing.T) {
	members := []Member{{Self: "https://a.mesh.test"}, {Self: "https://b.mesh.test"}}
	b := testBox(members...)
	if !b.Owns(hostOwnedBy(t, members, "https://a.mesh.test"), "") || b.Owns(hostOwnedBy(t, members, "https://b.mesh.test"), "") {
		t.Error("Owns disagrees with Owner")
	}
	if !b.Owns("x.other.net", "") {
		t.Error("a host outside the mesh is not this box's own")
	}
}

func TestRowsRoundTrip(t *testing.T) {
	b := testBox()
	live := registry.Route{Host: "l.mesh.test", Kind: "demo", Upstream: "127.0.0.1:9"}
	row := b.RowFromRoute(&live)
	if row.LivesAt != b.Self {
		t.Errorf("a live route served here replicates as lives_at %q, want this box", row.LivesAt)
	}
	rt := RouteFromRow(row)
	if rt.Upstream != "" || rt.LivesAt != b.Self {
		t.Errorf("a peer stores %+v: it must forward, never dial", rt)
	}
}
