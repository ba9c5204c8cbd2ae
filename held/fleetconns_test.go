package held

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/provider"
)

// TestProviderActsOnTheConnectionsTheFleetHolds: the instance of a hosted space, on the
// provider's box, lists the WebSocket a fleet's entry box holds (its pull's listing),
// counts it in a tag send, reaches it by its id, and is told 404 for an id no box
// holds, as across the boxes of its own mesh (docs/connections.md, "Across boxes");
// a close it makes leaves the listing at once.
func TestProviderActsOnTheConnectionsTheFleetHolds(t *testing.T) {
	const host = "room.example.com"
	p := openConns(t, boxtest.Open(t, boxtest.Options{}))
	pull := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.ServePull(w, r, host); err != nil {
			http.Error(w, err.Error(), box.StatusOf(err))
		}
	})
	_, _, ws, id := delegatedConn(t, host, pull)
	ctl := &clientControl{c: p, host: host, local: p.hub.ControlHandler(host)}
	call := func(method, target, body string) (int, string) {
		rec := httptest.NewRecorder()
		ctl.ServeHTTP(rec, httptest.NewRequest(method, "http://box"+target, strings.NewReader(body)))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	list := func() []connhold.ConnInfo {
		code, body := call(http.MethodGet, connhold.ConnsPath+"?tag=room", "")
		var l []connhold.ConnInfo
		if code != http.StatusOK || json.Unmarshal([]byte(body), &l) != nil {
			t.Fatalf("listing: %d %s", code, body)
		}
		return l
	}
	testwait.WaitFor(t, 10*time.Second, "the fleet's connection in the instance's listing", func() bool {
		l := list()
		return len(l) == 1 && l[0].ID == id && slices.Equal(l[0].Tags, []string{"room"}) && l[0].State == "open"
	})
	read := func(want string) {
		t.Helper()
		typ, msg, err := ws.Read(t.Context())
		if err != nil || typ != websocket.MessageText || string(msg) != want {
			t.Fatalf("the client read %v %q %v, want %q", typ, msg, err, want)
		}
	}
	if code, body := call(http.MethodPost, connhold.SendPath+"?tag=room", "to the room"); code != http.StatusOK || body != `{"sent":1}` {
		t.Fatalf("a tag send: %d %s, want the fleet's connection counted", code, body)
	}
	read("to the room")
	if code, _ := call(http.MethodPost, connhold.SendPath+"?conn="+connhold.NewID(), "to nobody"); code != http.StatusNotFound {
		t.Fatalf("a send to a connection no box holds: %d, want 404", code)
	}
	if code, _ := call(http.MethodPost, connhold.SendPath+"?conn="+id, "to you"); code != http.StatusNoContent {
		t.Fatalf("a send to the fleet's connection: %d, want 204", code)
	}
	read("to you")
	if code, _ := call(http.MethodPost, connhold.ClosePath+"?conn="+id+"&code=4000", ""); code != http.StatusNoContent {
		t.Fatalf("closing the fleet's connection: %d, want 204", code)
	}
	if l := list(); len(l) != 0 {
		t.Fatalf("listed after its close: %+v", l)
	}
	if _, _, err := ws.Read(t.Context()); websocket.CloseStatus(err) != 4000 {
		t.Fatalf("the client's socket: %v, want closed with 4000", err)
	}
}

// TestFleetConnsFollowListingsAndWhatTheBoxSaw: what the provider's box knows of a fleet
// entry box's connections is its last listing, overlaid by what the box saw since (an
// upgrade, a close) unless a listing came well after it, and nothing once its pulls
// stopped; an unknown id may be held only where the listing was cut.
func TestFleetConnsFollowListingsAndWhatTheBoxSaw(t *testing.T) {
	const host = "room.example.com"
	a, b, d := connhold.NewID(), connhold.NewID(), connhold.NewID()
	entry := provider.ClientEntry("fleet-a", "https://a1")
	c := &Conns{}
	t0 := time.Unix(1_700_000_000, 0)
	c.out.mu.Lock()
	ob := c.out.touchLocked(host, entry, t0)
	c.out.mu.Unlock()
	open := func(ids ...string) pullListing {
		var l pullListing
		for _, id := range ids {
			l.Conns = append(l.Conns, connhold.ConnInfo{ID: id, Tags: []string{"room"}, State: "open"})
		}
		return l
	}
	ids := func(now time.Time) []string {
		var out []string
		for _, ci := range c.fleetList(host, "", now) {
			out = append(out, ci.ID)
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }

	ob.pulls, ob.pulledAt = 1, t0
	ob.fleet.take(open(a), t0)
	ob.fleet.saw(b, connChange{tags: &[]string{"room"}}, t0.Add(time.Second)) // an upgrade
	ob.fleet.saw(a, connChange{gone: true}, t0.Add(2*time.Second))            // a close event
	if got := ids(t0.Add(3 * time.Second)); !slices.Equal(got, []string{b}) {
		t.Fatalf("after an upgrade and a close: %v, want [b]", got)
	}
	// A listing taken before the close came after it: the close stands.
	ob.fleet.take(open(a, b), t0.Add(4*time.Second))
	if got := ids(t0.Add(5 * time.Second)); !slices.Equal(got, []string{b}) {
		t.Fatalf("after a listing taken before the close: %v, want [b]", got)
	}
	if n := c.fleetCount(host, "room", t0.Add(5*time.Second)); n != 1 {
		t.Fatalf("tag count %d, want 1", n)
	}
	// A listing well after what the box saw is the word: d came, b's socket went.
	ob.fleet.take(open(a, d), t0.Add(30*time.Second))
	if got := ids(t0.Add(31 * time.Second)); !slices.Equal(got, sorted(a, d)) {
		t.Fatalf("after a later listing: %v, want [a d]", got)
	}
	if e := c.fleetHolders(host, b, t0.Add(31*time.Second)); len(e) != 0 {
		t.Fatalf("b, not listed, is held at %v", e)
	}
	// Its pulls stop: the listing counts for listingKeep, then no more.
	ob.pulls, ob.pulledAt = 0, t0.Add(40*time.Second)
	if e := c.fleetHolders(host, a, t0.Add(40*time.Second+listingKeep-time.Second)); !slices.Equal(e, []string{entry}) {
		t.Fatalf("a, just after the last pull: held at %v", e)
	}
	if got := ids(t0.Add(40*time.Second + listingKeep + time.Second)); len(got) != 0 {
		t.Fatalf("pulls stopped long ago: still listed %v", got)
	}
	// A cut listing: an id it leaves out may be held there.
	l := open(a)
	l.Partial = true
	ob.pulls = 1
	ob.fleet.take(l, t0.Add(2*time.Minute))
	if e := c.fleetHolders(host, d, t0.Add(2*time.Minute)); !slices.Equal(e, []string{entry}) {
		t.Fatalf("an id a cut listing leaves out: %v, want the entry box", e)
	}
}

// TestListingsAreBounded: an entry box cuts its listing at maxListingBytes and says so;
// the provider's box refuses one past the bound and leaves out a connection that breaks
// the contract's limits, marking the listing partial.
func TestListingsAreBounded(t *testing.T) {
	meta := bytes.Repeat([]byte("m"), connhold.MaxMeta)
	var list []connhold.ConnInfo
	for range 2 * maxListingBytes / connhold.MaxMeta {
		list = append(list, connhold.ConnInfo{ID: connhold.NewID(), Tags: []string{}, Meta: meta, State: "open"})
	}
	b := listingOf(list)
	l, err := readListing(bytes.NewReader(b))
	if len(b) > maxListingBytes || err != nil || !l.Partial || len(l.Conns) == 0 || len(l.Conns) >= len(list) {
		t.Fatalf("a cut listing: %d bytes, %v, partial %v, %d of %d", len(b), err, l.Partial, len(l.Conns), len(list))
	}
	if _, err := readListing(bytes.NewReader(bytes.Repeat([]byte(" "), maxListingBytes+1))); !errors.Is(err, errListingTooLarge) {
		t.Fatalf("past the bound: %v", err)
	}
	good := connhold.ConnInfo{ID: connhold.NewID(), Tags: []string{"room"}, State: "open"}
	for name, bad := range map[string]connhold.ConnInfo{
		"bad id":     {ID: "x", State: "open"},
		"bad state":  {ID: connhold.NewID(), State: "whatever"},
		"empty tag":  {ID: connhold.NewID(), Tags: []string{""}, State: "open"},
		"long tag":   {ID: connhold.NewID(), Tags: []string{strings.Repeat("t", connhold.MaxTagLen+1)}, State: "open"},
		"large meta": {ID: connhold.NewID(), Meta: append(meta, 'x'), State: "open"},
	} {
		b, _ := json.Marshal(pullListing{Conns: []connhold.ConnInfo{good, bad}})
		l, err := readListing(bytes.NewReader(b))
		if err != nil || !l.Partial || len(l.Conns) != 1 || l.Conns[0].ID != good.ID {
			t.Errorf("%s: %+v %v, want the good one alone, partial", name, l, err)
		}
	}
}
