package lchat

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/mesh"
)

// TestPeerTransport: a forward dials the peer's SELF address, presents the instance
// host as SNI, verifies the peer's certificate against that host (never skipping), marks
// the request with a MAC the peer accepts, and never reuses a connection verified for one
// host for another.
func TestPeerTransport(t *testing.T) {
	var gotSNI []string
	var gotValid []bool
	marker := mesh.Marker{Token: "t0ken"}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotValid = append(gotValid, marker.Valid(r.Header, mesh.NormalizeHost(r.Host)))
		io.WriteString(w, "ok "+r.Host)
	}))
	srv.TLS = &tls.Config{GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		gotSNI = append(gotSNI, hello.ServerName)
		return nil, nil
	}}
	srv.StartTLS()
	defer srv.Close()
	// httptest's certificate is for example.com (and *.example.com).
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	ms := withBox(&meshState{marker: marker, roots: roots, timeout: 5 * time.Second})
	pt := newPeerTransport(ms)
	self := srv.URL // https://127.0.0.1:port

	do := func(host string) (string, error) {
		ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{})
		caddyhttp.SetVar(ctx, peerSelfVar, self)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://placeholder/x", nil)
		req.Host = host
		req.Header.Set(mesh.ForwardedHeader, "spoofed")
		resp, err := pt.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), nil
	}

	for _, host := range []string{"a.example.com", "a.example.com", "b.example.com"} {
		body, err := do(host)
		if err != nil || body != "ok "+host {
			t.Fatalf("forward for %s: %q %v", host, body, err)
		}
	}
	if _, err := do("space.other.test"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("forward for a host the peer's certificate does not cover: err = %v, want a verification failure", err)
	}
	// One handshake for the two a.example.com requests, a new one for b, one (failing) for other.
	want := []string{"a.example.com", "b.example.com", "space.other.test"}
	if strings.Join(gotSNI, ",") != strings.Join(want, ",") {
		t.Errorf("SNI per handshake = %v, want %v (one pooled connection per instance host)", gotSNI, want)
	}
	for i, ok := range gotValid {
		if !ok {
			t.Errorf("request %d reached the peer without a valid marker", i)
		}
	}
}
