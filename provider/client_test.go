package provider

import (
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/mesh"
)

// TestHealthIsUnknownUntilARequestFinishes: a provider nothing was asked of is neither
// healthy nor failing on this box; the first answer makes it healthy, a request that gets
// no answer failing.
func TestHealthIsUnknownUntilARequestFinishes(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c, err := NewConn(&Provider{Name: "partner", URL: srv.URL, Token: mesh.Secret(strings.Repeat("t", 40)),
		AcceptToken: mesh.Secret(strings.Repeat("a", 40)), Domains: []string{"example.com"}}, ConnOptions{Roots: roots}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
