package provider

import (
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/mesh"
)

// TestHealthIsUnknownUntilARequestFinishes: a provider nothing was asked of is neither
// healthy nor failing on this box; the first answer makes it healthy, a request that gets
// no answer failing.
func TestHealthIsUnknownUntilARequestFinishes(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	c := partnerConn(t, srv)
	forward := func() {
		req, _ := http.NewRequest(http.MethodGet, "https://room.example.com/api/messages", nil)
		if resp, err := c.RoundTrip(req); err == nil {
			resp.Body.Close() // the answer's end is when it counts
		}
	}
	want := func(step, health string, healthy bool) {
		t.Helper()
		if h := c.Health(); h.Health != health || h.Healthy != healthy {
			t.Fatalf("%s: %+v, want health %q healthy %v", step, h, health, healthy)
		}
	}
	want("before any request", HealthUnknown, false)
	forward()
	want("after an answer", HealthHealthy, true)
	srv.CloseClientConnections()
	srv.Listener.Close()
	c.Close()
	forward()
	want("after no answer", HealthFailing, false)
	if h := c.Health(); h.Requests != 2 || h.Errors != 1 || h.LastError == "" {
		t.Fatalf("counts: %+v", h)
	}
}

// TestHeldWireIsVersioned: a fleet's request of the held-connection wire carries its
// version and a plain request none; an answer to it that names another version, or a 2xx
// or a replay without one, is refused (a *WireError); the version is not passed on; a
// provider's box refuses a request of the wire of another version (CheckWire).
func TestHeldWireIsVersioned(t *testing.T) {
	var sent string
	answer := func(w http.ResponseWriter, r *http.Request) {}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent = r.Header.Get(WireHeader)
		answer(w, r)
	}))
	defer srv.Close()
	c := partnerConn(t, srv)
	reply := func(code int, version string, h ...string) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			if version != "" {
				w.Header().Set(WireHeader, version)
			}
			for i := 0; i+1 < len(h); i += 2 {
				w.Header().Set(h[i], h[i+1])
			}
			w.WriteHeader(code)
		}
	}
	event := func() *http.Request {
		r, _ := http.NewRequest(http.MethodPost, "https://room.example.com"+connhold.EventPath, nil)
		r.Header.Set(connhold.EntryHeader, "https://a1")
		r.Header.Set(connhold.ConnIDHeader, connhold.NewID())
		return r
	}
	plain := func() *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "https://room.example.com/api/messages", nil)
		r.Header.Set(WireHeader, "9") // a client's: not passed on
		return r
	}
	for _, tc := range []struct {
		name    string
		req     func() *http.Request
		answer  func(http.ResponseWriter, *http.Request)
		sent    string
		refused bool
	}{
		{"an event acknowledged", event, reply(200, WireVersion), WireVersion, false},
		{"an event acknowledged by no version", event, reply(200, ""), WireVersion, true},
		{"a replay asked by no version", event, reply(409, "", connhold.ReplayHeader, "a b c"), WireVersion, true},
		{"an event refused by version 2", event, reply(400, "2"), WireVersion, true},
		{"an event refused, no version", event, reply(503, ""), WireVersion, false},
		{"a plain request", plain, reply(200, ""), "", false},
	} {
		answer = tc.answer
		resp, err := c.RoundTrip(tc.req())
		if sent != tc.sent {
			t.Errorf("%s: sent version %q, want %q", tc.name, sent, tc.sent)
		}
		var we *WireError
		if tc.refused != errors.As(err, &we) {
			t.Errorf("%s: %v, refused %v", tc.name, err, tc.refused)
		}
		if err == nil {
			if resp.Header.Get(WireHeader) != "" {
				t.Errorf("%s: the version passed on", tc.name)
			}
			resp.Body.Close()
		}
	}

	for _, tc := range []struct {
		version string
		ok      bool
	}{{WireVersion, true}, {"2", false}, {"", false}} {
		r := event()
		if tc.version != "" {
			r.Header.Set(WireHeader, tc.version)
		}
		if err := CheckWire(r); (err == nil) != tc.ok {
			t.Errorf("CheckWire of version %q: %v", tc.version, err)
		}
	}
	r, _ := http.NewRequest(http.MethodGet, "https://room.example.com/api/messages", nil)
	if err := CheckWire(r); err != nil {
		t.Errorf("CheckWire of a plain request: %v", err)
	}
}

// partnerConn is a connection to the provider "partner" at srv, trusting srv's certificate,
// closed with the test.
func partnerConn(t *testing.T, srv *httptest.Server) *Conn {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c, err := NewConn(&Provider{Name: "partner", URL: srv.URL, Token: mesh.Secret(strings.Repeat("t", 40)),
		AcceptToken: mesh.Secret(strings.Repeat("a", 40)), Domains: []string{"example.com"}}, ConnOptions{Roots: roots}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
