package mesh

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

func testBox(members ...Member) *Node {
	return &Node{
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
	b.IsDraining = func() bool { return draining }
	b.Holders = new(Holders)
	mine := hostOwnedBy(t, members, "https://a.mesh.test")
	theirs := hostOwnedBy(t, members, "https://b.mesh.test")
	hib := func(h string) *registry.Route { return &registry.Route{Host: h, Kind: "demo", Hibernate: true} }
	for _, tc := range []struct {
		name     string
		req      Request
		draining bool
		holder   string // where the space was last seen awake
		want     Decision
	}{
		{"owned here", Request{Route: hib(mine)}, false, "", Decision{Action: Serve}},
		{"owned by a peer", Request{Route: hib(theirs)}, false, "", Decision{Action: Forward, Peer: "https://b.mesh.test", Fallback: true}},
		{"owned by a peer, awake here", Request{Route: hib(theirs), AwakeHere: true}, false, "", Decision{Action: Serve}},
		{"awake here while draining", Request{Route: hib(theirs), AwakeHere: true}, true, "", Decision{Action: Serve}},
		{"asleep here while draining, forwarded", Request{Route: hib(theirs), Hops: 1}, true, "", Decision{Action: Forward, Peer: "https://b.mesh.test", Fallback: true}},
		{"forwarded to the owner", Request{Route: hib(mine), Hops: 1}, false, "", Decision{Action: Serve}},
		{"sent on a stale holder entry, asleep here", Request{Route: hib(theirs), Hops: 1, ViaHint: true}, false, "", Decision{Action: Forward, Peer: "https://b.mesh.test", Fallback: true}},
		{"sent on a holder entry to the owner, asleep here", Request{Route: hib(mine), Hops: 1, ViaHint: true}, false, "", Decision{Action: Serve}},
		{"forwarded twice", Request{Route: hib(theirs), Hops: 2}, false, "https://c.mesh.test", Decision{Action: Serve}},
		{"sent on the owner's stale holder entry, asleep here: the last hop kept for the holder", Request{Route: hib(theirs), Hops: 2, ViaHint: true}, false, "", Decision{Action: Serve}},
		{"awake on a non-owner", Request{Route: hib(theirs)}, false, "https://c.mesh.test", Decision{Action: Forward, Peer: "https://c.mesh.test", Hint: true, Fallback: true}},
		{"awake on a non-owner, owned here", Request{Route: hib(mine)}, false, "https://c.mesh.test", Decision{Action: Forward, Peer: "https://c.mesh.test", Hint: true, Fallback: true}},
		{"forwarded to the owner, awake on a non-owner", Request{Route: hib(mine), Hops: 1}, false, "https://c.mesh.test", Decision{Action: Forward, Peer: "https://c.mesh.test", Hint: true, Fallback: true}},
		{"last seen awake on a box that left", Request{Route: hib(theirs)}, false, "https://gone.mesh.test", Decision{Action: Forward, Peer: "https://b.mesh.test", Fallback: true}},
		{"outside the mesh", Request{Route: hib("x.other.net")}, false, "", Decision{Action: Serve}},
		{"live route here", Request{Route: &registry.Route{Host: "l.mesh.test", Upstream: "127.0.0.1:9"}}, false, "", Decision{Action: Serve}},
		{"live route pinned to a peer", Request{Route: &registry.Route{Host: "l.mesh.test", LivesAt: "https://c.mesh.test"}}, false, "", Decision{Action: Forward, Peer: "https://c.mesh.test"}},
		{"live route pinned to this box", Request{Route: &registry.Route{Host: "l.mesh.test", LivesAt: "https://a.mesh.test"}}, false, "", Decision{Action: Serve}},
	} {
		draining = tc.draining
		b.Holders.Forget(tc.req.Route.Host)
		if tc.holder != "" {
			b.Holders.Put(tc.req.Route.Host, tc.holder)
		}
		if got := b.Place(tc.req); got != tc.want {
			t.Errorf("%s: Place = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	draining = false
	loop := b.Place(Request{Route: &registry.Route{Host: "l.mesh.test", LivesAt: "https://c.mesh.test"}, Hops: 1})
	if loop.Action != Unavailable || !strings.Contains(loop.Reason, "already forwarded") {
		t.Errorf("a forwarded request for a route pinned elsewhere: %+v, want unavailable", loop)
	}
}

// The owner of a space awake elsewhere forwards to the holder named by the lease, and
// remembers it: the next request goes there without a wake attempt (no bucket request).
func TestLeaseHeld(t *testing.T) {
	members := []Member{{Self: "https://a.mesh.test"}, {Self: "https://b.mesh.test"}}
	b := testBox(members...)
	b.Holders = new(Holders)
	mine := hostOwnedBy(t, members, "https://a.mesh.test")
	if d := b.LeaseHeld(mine, "https://b.mesh.test", 1); d != (Decision{Action: Forward, Peer: "https://b.mesh.test"}) {
		t.Errorf("held by a peer, forwarded once: %+v, want a forward to it", d)
	}
	route := &registry.Route{Host: mine, Kind: "demo", Hibernate: true}
	if d := b.Place(Request{Route: route, Hops: 1}); d.Action != Forward || d.Peer != "https://b.mesh.test" {
		t.Errorf("the next request: %+v, want it sent to the holder directly", d)
	}
	// A request that made placement's last forward and finds the lease moved on still
	// follows the lease, once (a rolling restart handed the space over between the
	// previous box's read of the lease and this one's).
	if d := b.LeaseHeld(mine, "https://b.mesh.test", PlaceHops); d != (Decision{Action: Forward, Peer: "https://b.mesh.test"}) {
		t.Errorf("held by a peer, after placement's last forward: %+v, want a forward to it", d)
	}
	for name, d := range map[string]Decision{
		"forwarded as often as allowed": b.LeaseHeld(mine, "https://b.mesh.test", MaxHops),
		"held by this box":              b.LeaseHeld(mine, "https://a.mesh.test", 0),
		"not a mesh box":                b.LeaseHeld(mine, "box:1234", 0),
	} {
		if d.Action != Unavailable {
			t.Errorf("%s: %+v, want unavailable", name, d)
		}
	}
}

func TestDrainingForwardsToTheOwner(t *testing.T) {
	members := []Member{{Self: "https://a.mesh.test", Draining: true}, {Self: "https://b.mesh.test"}}
	b := testBox(members...)
	host := "x.mesh.test"
	if d := b.Draining(host, "", 2); d != (Decision{Action: Forward, Peer: "https://b.mesh.test"}) {
		t.Errorf("Draining = %+v, want the live owner", d)
	}
	if d := b.Draining(host, "", PlaceHops); d.Action != Unavailable {
		t.Errorf("after the last forward: %+v, want unavailable", d)
	}
	if d := testBox(Member{Self: "https://a.mesh.test", Draining: true}).Draining(host, "", 0); d.Action != Unavailable {
		t.Errorf("no other box: %+v, want unavailable", d)
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

// TestNextLeaseWait: a request for a space whose lease holder takes no connections waits
// by leaseWaitBackoff (100ms, 200ms, 400ms, then 500ms each) and gives up before
// MaxLeaseWait.
func TestNextLeaseWait(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct{ waited, step time.Duration }{
		{0, 100 * ms}, {100 * ms, 200 * ms}, {300 * ms, 400 * ms}, {700 * ms, 500 * ms},
		{1200 * ms, 500 * ms}, {14200 * ms, 500 * ms}, {14700 * ms, 0},
	} {
		if got := NextLeaseWait(tc.waited); got != tc.step {
			t.Errorf("after %v waited: step %v, want %v", tc.waited, got, tc.step)
		}
	}
	var waited time.Duration
	steps := 0
	for {
		step := NextLeaseWait(waited)
		if step == 0 {
			break
		}
		waited += step
		steps++
	}
	if waited > MaxLeaseWait || waited < MaxLeaseWait-time.Second {
		t.Errorf("gave up after %v (%d tries), want about %v", waited, steps, MaxLeaseWait)
	}
}

// loadedBox is box self of a fleet of mesh.test boxes with the given published loads,
// placing by bounded loads over a Placement of that view.
func loadedBox(self string, ms []Member) *Node {
	p := new(Placement)
	p.SetView(ms)
	return &Node{Self: self, Domains: []string{"mesh.test"}, Live: func() []Member { return ms },
		Placement: p, Balance: DefaultBalance, Holders: new(Holders)}
}

// ownerFull is a three-box view of host's candidates in HRW order: a budget of 1,000 MiB
// each, 100 MiB warm on each box but the owner, which holds ownerWarm.
func ownerFull(host string, ownerWarm int64) (ms []Member, ranked []string) {
	ms = []Member{{Self: "https://a.mesh.test"}, {Self: "https://b.mesh.test"}, {Self: "https://c.mesh.test"}}
	for i := range ms {
		ms[i].Budget, ms[i].WarmSet, ms[i].Awake = 1000*mib, 100*mib, 1
	}
	r := Ranked(host, ms, "")
	ms[r[0]].WarmSet = ownerWarm * mib
	for _, i := range r {
		ranked = append(ranked, ms[i].Self)
	}
	return ms, ranked
}

// TestFiresWake: a due scheduled wake fires where bounded loads wake the space, not on
// its plain HRW owner; boxes whose views of the loads differ may each place it on the
// other, and then the owner fires it once it is WakeOverdue late, never never.
func TestFiresWake(t *testing.T) {
	const host = "wake.mesh.test"
	full, r := ownerFull(host, 990)
	roomy, _ := ownerFull(host, 100)
	owner, next := r[0], r[1]
	for _, tc := range []struct {
		name string
		box  *Node
		late time.Duration
		want bool
	}{
		{"the owner, full in its view, on time", loadedBox(owner, full), 0, false},
		{"the next box, the target in its view", loadedBox(next, full), 0, true},
		{"the owner, with room in its view", loadedBox(owner, roomy), 0, true},
		{"the next box, the owner having room in its view", loadedBox(next, roomy), 0, false},
		// Views that differ so that each places the wake on the other: both skip it, until
		// it is overdue; then the plain owner fires it, and only the owner.
		{"the owner, full in its view, nearly overdue", loadedBox(owner, full), WakeOverdue - time.Second, false},
		{"the owner, full in its view, overdue", loadedBox(owner, full), WakeOverdue, true},
		{"the next box, the owner having room in its view, overdue", loadedBox(next, roomy), WakeOverdue, false},
		{"a third box, overdue", loadedBox(r[2], full), time.Hour, false},
	} {
		if got := tc.box.FiresWake(host, "", tc.late); got != tc.want {
			t.Errorf("%s: FiresWake = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAtCap: a box that refused a wake at max_awake sends the request to where the space
// would wake without it: the next box with room in the host's HRW order, not a full one,
// and never back to itself; the hops stay bounded.
func TestAtCap(t *testing.T) {
	const host = "wake.mesh.test"
	ms, r := ownerFull(host, 100)
	// The third candidate is the lightest; the second is past the tight bound.
	for i := range ms {
		switch ms[i].Self {
		case r[1]:
			ms[i].WarmSet = 700 * mib
		case r[2]:
			ms[i].WarmSet = 50 * mib
		}
	}
	b := loadedBox(r[0], ms)
	if d := b.AtCap(host, "", 0); d != (Decision{Action: Forward, Peer: r[2]}) {
		t.Errorf("at the cap, from a client: %+v, want a forward to %s, the box with room", d, r[2])
	}
	if d := loadedBox(r[2], ms).AtCap(host, "", 1); d.Action != Forward || d.Peer == r[2] {
		t.Errorf("the box forwarded to is at its cap too: %+v, want a forward to another box", d)
	}
	for name, d := range map[string]Decision{
		"forwarded as often as allowed": b.AtCap(host, "", PlaceHops),
		"outside the mesh":              b.AtCap("x.other.net", "", 0),
		"no other box":                  loadedBox(r[0], ms[:0:0]).AtCap(host, "", 0),
	} {
		if d.Action != Unavailable || !strings.Contains(d.Reason, "max_awake") {
			t.Errorf("%s: %+v, want unavailable at the cap", name, d)
		}
	}
	alone := []Member{{Self: r[0]}}
	alone[0].Budget = 1000 * mib
	if d := loadedBox(r[0], alone).AtCap(host, "", 0); d.Action != Unavailable {
		t.Errorf("the only box: %+v, want unavailable", d)
	}
}

// TestHintedRequestGoesToTheTarget: a request sent on a holder entry that finds the space
// asleep (it slept there, the entry still fresh) goes on to where the space wakes by
// bounded loads, not to its plain HRW owner, which is full, and not woken where the entry
// pointed.
func TestHintedRequestGoesToTheTarget(t *testing.T) {
	const host = "wake.mesh.test"
	ms, r := ownerFull(host, 990)
	owner, target, stale := r[0], r[1], r[2]
	route := &registry.Route{Host: host, Kind: "demo", Hibernate: true}
	b := loadedBox(stale, ms)
	if d := b.Place(Request{Route: route, Hops: 1, ViaHint: true}); d != (Decision{Action: Forward, Peer: target, Fallback: true}) {
		t.Errorf("hinted request asleep on %s: %+v, want a forward to %s (plain HRW: %s)", stale, d, target, owner)
	}
	if d := loadedBox(target, ms).Place(Request{Route: route, Hops: 1, ViaHint: true}); d.Action != Serve {
		t.Errorf("hinted request asleep on the target: %+v, want woken there", d)
	}
	if d := loadedBox(target, ms).Place(Request{Route: route, Hops: 2}); d.Action != Serve {
		t.Errorf("the hinted request sent on, reaching the target: %+v, want served there", d)
	}
	// The entry box follows a fresh entry; the box it points at decides as above.
	entry := loadedBox(owner, ms)
	entry.Holders.Put(host, stale)
	if d := entry.Place(Request{Route: route}); d != (Decision{Action: Forward, Peer: stale, Hint: true, Fallback: true}) {
		t.Errorf("entry box with a fresh holder entry: %+v, want a hinted forward to %s", d, stale)
	}
}
