package lchat

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/held"
	"github.com/lchat/lchat-caddy/registry"
)

// TestKindRemovedIs503WithRetryAfter: a route whose kind a reload removed answers 503
// with a Retry-After (the handler's default) and its page; why is in the box's log.
func TestKindRemovedIs503WithRetryAfter(t *testing.T) {
	app := testApp(t, boxtest.Options{Settings: box.Settings{Kinds: map[string]engine.Kind{"other": {Name: "other", Command: "/bin/true"}}}})
	const host = "gone.example.com"
	if _, err := app.box.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: app}
	a := serveLogged(t, h, httptest.NewRequest("GET", "http://"+host+"/", nil), nil)
	if a.err != nil || a.Code != http.StatusServiceUnavailable {
		t.Fatalf("ServeHTTP = %d, %v; want a 503 answered", a.Code, a.err)
	}
	if got := a.Header().Get("Retry-After"); got != "7" {
		t.Fatalf("Retry-After = %q, want the handler's default 7", got)
	}
	if !strings.Contains(a.Body.String(), "try again in 7 seconds") {
		t.Fatalf("page %q does not say when to try again", a.Body.String())
	}
	if !strings.Contains(a.logged, "kind is not configured") {
		t.Fatalf("logged reason %q does not say the kind is not configured", a.logged)
	}
}

// TestBadHandshakeWakesNothing: a WebSocket handshake the box could not complete (a
// version other than 13, a bad key) is answered 400 before the space is asked, with
// Sec-WebSocket-Version: 13 for a version it does not speak (RFC 6455 section 4.4): it
// wakes nothing.
func TestBadHandshakeWakesNothing(t *testing.T) {
	app := testApp(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	cs, err := held.New(held.Config{Box: app.box, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); cs.Finish() })
	app.conns = cs
	const host = "space.example.com"
	if _, err := app.box.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: app}
	for _, tc := range []struct {
		name, version, key, wantVersion string
	}{
		{"version 8", "8", "dGhlIHNhbXBsZSBub25jZQ==", "13"},
		{"no version", "", "dGhlIHNhbXBsZSBub25jZQ==", "13"},
		{"short key", "13", "c2hvcnQ=", ""},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "http://"+host+"/ws", nil)
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Key", tc.key)
		if tc.version != "" {
			r.Header.Set("Sec-WebSocket-Version", tc.version)
		}
		req := caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
		err := h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		var he caddyhttp.HandlerError
		if !asHandlerError(err, &he) || he.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: ServeHTTP = %v, want a 400", tc.name, err)
		}
		if got := w.Header().Get("Sec-WebSocket-Version"); got != tc.wantVersion {
			t.Errorf("%s: Sec-WebSocket-Version %q, want %q", tc.name, got, tc.wantVersion)
		}
		if boxtest.Awake(app.box, host) {
			t.Fatalf("%s: the space woke for a handshake the box refuses", tc.name)
		}
	}
}
