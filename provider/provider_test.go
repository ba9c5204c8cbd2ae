package provider

import (
	"errors"
	"github.com/lchat/lchat-caddy/connhold"
	"net/http"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

// TestScopeRules: a provider hosts only its domains up to its cap; a client acts only on
// the routes hosted for it, never on the fleet's own or another client's.
func TestScopeRules(t *testing.T) {
	p := &Provider{Name: "partner", Domains: []string{"rooms.example.com"}, MaxSpaces: 2}
	if err := p.MayDelegate("a.rooms.example.com", 1); err != nil {
		t.Fatal(err)
	}
	if err := p.MayDelegate("a.other.example.com", 0); !errors.Is(err, ErrNotCovered) {
		t.Fatalf("outside the domains: %v", err)
	}
	if err := p.MayDelegate("rooms.example.com", 0); !errors.Is(err, ErrNotCovered) {
		t.Fatalf("the domain itself: %v", err)
	}
	if err := p.MayDelegate("a.rooms.example.com", 2); !errors.Is(err, ErrCap) {
		t.Fatalf("at the cap: %v", err)
	}
	a := &Client{Name: "fleet-a", Domains: []string{"rooms.example.com"}, MaxSpaces: 1}
	own := &registry.Route{Host: "x.rooms.example.com"}
	ofB := &registry.Route{Host: "y.rooms.example.com", HostedFor: "fleet-b"}
	ofA := &registry.Route{Host: "z.rooms.example.com", HostedFor: "fleet-a"}
	for _, tc := range []struct {
		cur    *registry.Route
		hosted int
		want   error
	}{
		{nil, 0, nil}, {ofA, 5, nil}, {own, 0, ErrNotYours}, {ofB, 0, ErrNotYours}, {nil, 1, ErrCap},
	} {
		host := "new.rooms.example.com"
		if tc.cur != nil {
			host = tc.cur.Host
		}
		if err := a.MayHost(host, tc.cur, tc.hosted); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("MayHost(%s, %+v, %d) = %v, want %v", host, tc.cur, tc.hosted, err, tc.want)
		}
	}
}

// TestMarkerNamesItsClient: the marker verifies only with the token that signed it, for
// the host it was signed for, within the window; it is removed whatever it is.
func TestMarkerNamesItsClient(t *testing.T) {
	a := &Client{Name: "fleet-a", Token: keyA}
	b := &Client{Name: "fleet-b", Token: keyB}
	cs := Clients{a, b}
	now := time.Unix(1_700_000_000, 0)
	h := http.Header{}
	(&Provider{Token: keyB}).Mark(h, testHost, now)
	if c := cs.StripClient(h, testHost, now); c != b || h.Get(MarkerHeader) != "" {
		t.Fatalf("client %v, header left %q", c, h.Get(MarkerHeader))
	}
	for name, tc := range map[string]struct {
		value string
		host  string
		at    time.Time
	}{
		"another host": {"", "other.example.com", now},
		"stale":        {"", testHost, now.Add(2 * time.Minute)},
		"forged":       {"1700000000.00", testHost, now},
	} {
		h := http.Header{}
		(&Provider{Token: keyA}).Mark(h, testHost, now)
		if tc.value != "" {
			h.Set(MarkerHeader, tc.value)
		}
		if c := cs.StripClient(h, tc.host, tc.at); c != nil || h.Get(MarkerHeader) != "" {
			t.Errorf("%s: client %v, header left %q", name, c, h.Get(MarkerHeader))
		}
	}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+string(keyA))
	if cs.Authenticate(r) != a {
		t.Fatal("fleet-a's token did not authenticate fleet-a")
	}
	r.Header.Set("Authorization", "Bearer "+string(keyA)+"x")
	if cs.Authenticate(r) != nil {
		t.Fatal("a wrong token authenticated")
	}
}

// FuzzSplitPath: a provider API path names a valid host and a known operation, or nothing.
func FuzzSplitPath(f *testing.F) {
	for _, s := range []string{PathSpaces + "a.example.com", PathSpaces + "a.example.com/export", PathSpaces + "../x", PathSpaces + "A.example.com/state", "/api/provider/v1/spaces"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		host, op, ok := SplitPath(p)
		if !ok {
			return
		}
		if registry.ValidateHost(host) != nil {
			t.Fatalf("%q: host %q is not valid", p, host)
		}
		switch op {
		case OpSpace, OpState, OpHibernate, OpResume, OpExport:
		default:
			t.Fatalf("%q: operation %q", p, op)
		}
	})
}

// TestClientRequest: a fleet's signed request keeps only the headers of the held
// connections its entry box keeps (an event stream's, an upgrade's, an event's, a pull's);
// a plain request loses every peer header, and the rest of the box's own namespace, or
// an event without its entry or connection, is refused.
func TestClientRequest(t *testing.T) {
	mk := func(method, path string, h map[string]string) *http.Request {
		r, _ := http.NewRequest(method, "https://room.example.com"+path, nil)
		for k, v := range h {
			r.Header.Set(k, v)
		}
		return r
	}
	entry, id := "https://a-box.example.net", connhold.NewID()
	r := mk("GET", "/api/events", map[string]string{"Accept": "text/event-stream", "Lchat-Ws-Entry": entry, "Lchat-Sse-Reopen": "1",
		"Lchat-Ws-Prior": "x", "Lchat-Conn-Id": id})
	if !ClientRequest(r) || r.Header.Get("Lchat-Ws-Entry") != entry || r.Header.Get("Lchat-Sse-Reopen") != "1" ||
		r.Header.Get("Lchat-Ws-Prior") != "" || r.Header.Get("Lchat-Conn-Id") != "" {
		t.Fatalf("an event stream: %v", r.Header)
	}
	r = mk("GET", "/api/ws", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Lchat-Ws-Entry": entry,
		"Lchat-Conn-Id": id, "Lchat-Ws-Ack-At": "x y z"})
	if !ClientRequest(r) || r.Header.Get("Lchat-Ws-Entry") != entry || r.Header.Get("Lchat-Conn-Id") != id || r.Header.Get("Lchat-Ws-Ack-At") != "" {
		t.Fatalf("an upgrade for the entry box: %v", r.Header)
	}
	r = mk("GET", "/api/ws", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Lchat-Ws-Entry": entry, "Lchat-Conn-Id": "bad"})
	if !ClientRequest(r) || r.Header.Get("Lchat-Ws-Entry") != "" || r.Header.Get("Lchat-Conn-Id") != "" {
		t.Fatalf("an upgrade with a malformed connection id kept its peer headers: %v", r.Header)
	}
	r = mk("POST", "/.lchat/ws/event", map[string]string{"Lchat-Ws-Entry": entry, "Lchat-Conn-Id": id, "Lchat-Ws-Prior": "a b c",
		"Lchat-Ws-Covered": "9"})
	if !ClientRequest(r) || r.Header.Get("Lchat-Ws-Prior") != "a b c" || r.Header.Get("Lchat-Ws-Covered") != "" {
		t.Fatalf("an event: %v", r.Header)
	}
	r = mk("POST", PullPath, map[string]string{"Lchat-Ws-Entry": entry})
	if !ClientRequest(r) || r.Header.Get("Lchat-Sse-Reopen") != "1" {
		t.Fatalf("a pull is never a wake: %v", r.Header)
	}
	r = mk("GET", "/api/messages", map[string]string{"Lchat-Ws-Entry": entry})
	if !ClientRequest(r) || r.Header.Get("Lchat-Ws-Entry") != "" {
		t.Fatalf("a plain request kept the entry: %v", r.Header)
	}
	for _, bad := range []*http.Request{mk("POST", "/.lchat/ws/event", nil), mk("POST", "/.lchat/ws/event", map[string]string{"Lchat-Ws-Entry": entry}),
		mk("POST", PullPath, nil), mk("GET", PullPath, map[string]string{"Lchat-Ws-Entry": entry}), mk("POST", "/.lchat/ws/send", map[string]string{"Lchat-Ws-Entry": entry}), mk("GET", "/.lchat/ws/conns", nil)} {
		if ClientRequest(bad) {
			t.Fatalf("a fleet reached the box's namespace: %s %s %v", bad.Method, bad.URL.Path, bad.Header)
		}
	}
}
