package lchat

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/mesh"
)

// TestLivesAtRouteIsForwardedNeverDialed: a lives_at row (a live space pinned to a
// peer) is forwarded once to the peer's SELF, a request already forwarded gets a 503
// with Retry-After instead of a second hop, and without the mesh such a row is a 503
// too: nothing is ever dialed locally for it.
func TestLivesAtRouteIsForwardedNeverDialed(t *testing.T) {
	var peerHits atomic.Int64
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peerHits.Add(1)
		io.WriteString(w, "served by the peer for "+r.Host)
	}))
	defer peer.Close()

	const host = "live.mesh.test"
	row := mesh.RouteFromRow(mesh.RouteRow{Host: host, Kind: "demo", LivesAt: peer.URL})
	app, cctx := testMesh(t)
	if _, err := app.box.Registry().Put(row); err != nil {
		t.Fatal(err)
	}
	if rt, _ := app.box.Lookup(host); rt.Upstream != "" {
		t.Fatalf("lives_at row stored with upstream %q", rt.Upstream)
	}
	ms := app.box.Mesh()

	// serve answers the request, with the reason of a refusal (logged beside its page) in
	// place of the body.
	serve := func(h *Handler, marked bool) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest("GET", "http://"+host+"/x", nil)
		if marked {
			ms.Marker().Mark(req.Header, host)
		}
		a := serveLogged(t, h, req, nil)
		if a.err != nil {
			t.Fatalf("ServeHTTP: %v", a.err)
		}
		if a.logged != "" {
			a.Body.Reset()
			a.Body.WriteString(a.logged)
		}
		return a.ResponseRecorder
	}

	withMesh := &Handler{RetryAfter: caddy.Duration(7e9), app: app}
	var err error
	if withMesh.meshProxy, err = newForwardProxy(cctx, ms, -1); err != nil {
		t.Fatal(err)
	}
	w := serve(withMesh, false)
	if w.Code != 200 || w.Body.String() != "served by the peer for "+host || peerHits.Load() != 1 {
		t.Fatalf("unmarked request: %d %q (peer hits %d), want the peer's answer", w.Code, w.Body.String(), peerHits.Load())
	}
	w = serve(withMesh, true)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "7" || peerHits.Load() != 1 ||
		!strings.Contains(w.Body.String(), "already forwarded") {
		t.Fatalf("already-forwarded request: %d Retry-After %q %q (peer hits %d), want 503 with Retry-After and no second hop",
			w.Code, w.Header().Get("Retry-After"), w.Body.String(), peerHits.Load())
	}
	if ms.C.LivesAtLoops.Load() != 1 || ms.C.Forwards.Load() != 1 {
		t.Fatalf("counters: lives_at_loops %d forwards %d", ms.C.LivesAtLoops.Load(), ms.C.Forwards.Load())
	}

	noMesh := &Handler{RetryAfter: caddy.Duration(7e9), app: testApp(t, boxtest.Options{})}
	if _, err := noMesh.app.box.Registry().Put(row); err != nil {
		t.Fatal(err)
	}
	w = serve(noMesh, false)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || peerHits.Load() != 1 ||
		!strings.Contains(w.Body.String(), mustHost(peer.URL)) {
		t.Fatalf("lives_at row without the mesh: %d %q, want 503 naming the box it lives on", w.Code, w.Body.String())
	}
}

func mustHost(u string) string {
	p, _ := url.Parse(u)
	return p.Host
}

func asHandlerError(err error, out *caddyhttp.HandlerError) bool {
	he, ok := err.(caddyhttp.HandlerError)
	if ok {
		*out = he
	}
	return ok
}
