package box

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/lifecycle"
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
	ms := &Mesh{marker: marker, roots: roots, timeout: 5 * time.Second}
	pt := ms.PeerTransport(func(err error) error { return err })

	do := func(host string) (string, error) {
		ctx := WithPeer(context.Background(), Peer{Self: srv.URL}) // https://127.0.0.1:port
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

// TestPeerClientsDialDirectly: neither the forward transport nor the replication client
// goes through an environment proxy (HTTP_PROXY and friends, often set for S3 access):
// both carry mesh credentials (the token, or a marker made with it).
func TestPeerClientsDialDirectly(t *testing.T) {
	cfg := mesh.Config{Self: "http://box-a.example.net", Domains: []string{"mesh.test"}, Token: "real-token"}
	ms, err := newMesh(cfg, MeshOptions{}, membucket.New(), "", lifecycle.New(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer ms.close()
	if tr, ok := ms.client.HTTPClient.Transport.(*http.Transport); !ok || tr.Proxy != nil {
		t.Errorf("replication client transport %T has a proxy function", ms.client.HTTPClient.Transport)
	}
	if pt := ms.PeerTransport(func(err error) error { return err }); pt.tr.Proxy != nil {
		t.Errorf("forward transport has a proxy function")
	}
}

// TestRetrySafe: a forward may be sent again, or served here, only when nothing reached
// a peer that could have acted on it.
func TestRetrySafe(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dial   bool
		method string
		length int64
		err    error
		want   bool
	}{
		{"dial failed, a write", true, "POST", 12, errors.New("connection refused"), true},
		{"GET closed before an answer", false, "GET", 0, io.EOF, true},
		{"HEAD reset", false, "HEAD", 0, syscall.ECONNRESET, true},
		{"GET cut mid-answer", false, "GET", 0, io.ErrUnexpectedEOF, true},
		{"POST closed before an answer", false, "POST", 12, io.EOF, false},
		{"GET with a body", false, "GET", 5, io.EOF, false},
		{"GET timed out", false, "GET", 0, context.DeadlineExceeded, false},
	} {
		if got := RetrySafe(tc.dial, tc.method, tc.length, tc.err); got != tc.want {
			t.Errorf("%s: RetrySafe = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNoAnswer: the reverse proxy's 502 and 504 mean the upstream never answered.
func TestNoAnswer(t *testing.T) {
	for status, want := range map[int]bool{502: true, 504: true, 503: false, 500: false, 499: false, 200: false} {
		if NoAnswer(status) != want {
			t.Errorf("NoAnswer(%d) = %v, want %v", status, !want, want)
		}
	}
}
