package lchat

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/mesh"
)

// TestForwardToClosingPeer: a peer that takes the connection and closes it without an
// answer (a box shutting down) is, for a bodiless GET or HEAD, treated like a peer that
// cannot be dialed: the forward reports it not sent, writing nothing (the caller serves
// it here, where the lease decides, or waits for the lease; box.Serve then forgets the
// stale holder entry: TestServeFallsBackHere). A request with a body may have been applied, so it gets a 503 with
// Retry-After, never a 502.
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
	app, cctx := testMesh(t)
	ms := app.box.Mesh()
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: app}
	if h.meshProxy, err = newForwardProxy(cctx, ms, -1); err != nil {
		t.Fatal(err)
	}
	forward := func(method string, body string) (*httptest.ResponseRecorder, box.Forwarded, error) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req := httptest.NewRequest(method, "http://"+host+"/api/messages", rd)
		w := httptest.NewRecorder()
		req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, &caddyhttp.Server{})
		p := &proxying{h: h, w: w, r: req, host: host, next: caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })}
		res, err := p.Forward(mesh.Decision{Action: mesh.Forward, Peer: peer, Fallback: true})
		return w, res, err
	}
	for _, method := range []string{"GET", "HEAD"} {
		w, res, err := forward(method, "")
		if res != box.NotSent || err == nil {
			t.Fatalf("%s to a closing peer: result %v err %v, want it not sent (served here, or tried again)", method, res, err)
		}
		if w.Code != 200 || w.Body.Len() != 0 || len(w.Header()) != 0 {
			t.Fatalf("%s to a closing peer wrote %d %v %q before serving here", method, w.Code, w.Header(), w.Body.String())
		}
	}
	if scheme == "https" {
		w, res, err := forward("POST", `{"text":"hi"}`)
		if res != box.NotSent || w.Code != 200 || w.Body.Len() != 0 {
			t.Fatalf("POST to a peer closing in the TLS handshake: result %v err %v, want it not sent", res, err)
		}
		return
	}
	w, res, err := forward("POST", `{"text":"hi"}`)
	var he caddyhttp.HandlerError
	if res != box.Answered || !asHandlerError(err, &he) || he.StatusCode != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "7" {
		t.Fatalf("POST to a closing peer: result %v err %v Retry-After %q, want a 503 with Retry-After", res, err, w.Header().Get("Retry-After"))
	}
}
