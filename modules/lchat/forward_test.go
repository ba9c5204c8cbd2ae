package lchat

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

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

// TestForwardToClosingPeer: a peer that takes the connection and closes it without an
// answer (a box shutting down) is, for a bodiless GET or HEAD sent on a placement
// decision, treated like a peer that cannot be dialed: the request is served here (where
// the lease decides) and the stale holder entry is forgotten. A request with a body may
// have been applied, so it gets a 503 with Retry-After, never a 502.
func TestForwardToClosingPeer(t *testing.T) {
	testForwardToClosingPeer(t, "http")
}

// TestForwardToPeerClosingInHandshake: an https peer whose connection closes during the
// TLS handshake (a proxy or balancer accepted for a box that is gone) was sent nothing,
// so any request, a write too, is served here as when the dial fails.
func TestForwardToPeerClosingInHandshake(t *testing.T) {
	testForwardToClosingPeer(t, "https")
}

func testForwardToClosingPeer(t *testing.T, scheme string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// Read the request head, then close without a byte of answer.
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				c.Read(buf)
				c.Close()
			}()
		}
	}()
	const host = "closing.mesh.test"
	peer := scheme + "://" + ln.Addr().String()
	ms, cctx := testMesh(t)
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: &App{shared: &shared{mesh: ms}}, logger: zap.NewNop()}
	if h.meshProxy, err = newForwardProxy(cctx, ms, -1); err != nil {
		t.Fatal(err)
	}
	forward := func(method string, body string, fallback bool) (*httptest.ResponseRecorder, bool, error) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req := httptest.NewRequest(method, "http://"+host+"/api/messages", rd)
		w := httptest.NewRecorder()
		req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, &caddyhttp.Server{})
		ms.box.Holders.Put(host, peer)
		done, err := h.forward(w, req, peer, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }), fallback)
		return w, done, err
	}
	for _, method := range []string{"GET", "HEAD"} {
		w, done, err := forward(method, "", true)
		if done || err != nil {
			t.Fatalf("%s to a closing peer: done %v err %v, want it served here", method, done, err)
		}
		if w.Code != 200 || w.Body.Len() != 0 || len(w.Header()) != 0 {
			t.Fatalf("%s to a closing peer wrote %d %v %q before serving here", method, w.Code, w.Header(), w.Body.String())
		}
		if _, ok := ms.box.Holders.Get(host); ok {
			t.Fatalf("%s: the holder entry for the closing peer was kept", method)
		}
	}
	if scheme == "https" {
		w, done, err := forward("POST", `{"text":"hi"}`, true)
		if done || err != nil || w.Code != 200 || w.Body.Len() != 0 {
			t.Fatalf("POST to a peer closing in the TLS handshake: done %v err %v, want it served here", done, err)
		}
		return
	}
	w, done, err := forward("POST", `{"text":"hi"}`, true)
	var he caddyhttp.HandlerError
	if !done || !asHandlerError(err, &he) || he.StatusCode != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "7" {
		t.Fatalf("POST to a closing peer: done %v err %v Retry-After %q, want a 503 with Retry-After", done, err, w.Header().Get("Retry-After"))
	}
	// Forwarded to a lease holder (no fallback), a GET is left to the caller's lease wait.
	_, done, err = forward("GET", "", false)
	if !done || !closedBeforeAnswer(httptest.NewRequest("GET", "/", nil), err) {
		t.Fatalf("GET to a closing holder without fallback: done %v err %v, want the closed connection reported", done, err)
	}
}
