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
	"github.com/lchat/lchat-caddy/registry"
)

// TestKindRemovedIs503WithRetryAfter: a route whose kind a reload removed answers 503
// with a Retry-After (the handler's default) and a message saying why.
func TestKindRemovedIs503WithRetryAfter(t *testing.T) {
	app := testApp(t, boxtest.Options{Settings: box.Settings{Kinds: map[string]engine.Kind{"other": {Name: "other", Command: "/bin/true"}}}})
	const host = "gone.example.com"
	if _, err := app.box.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: app}
	w := httptest.NewRecorder()
	req := caddyhttp.PrepareRequest(httptest.NewRequest("GET", "http://"+host+"/", nil), caddy.NewReplacer(), w, &caddyhttp.Server{})
	err := h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	var he caddyhttp.HandlerError
	if !asHandlerError(err, &he) || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("ServeHTTP = %v, want a 503", err)
	}
	if got := w.Header().Get("Retry-After"); got != "7" {
		t.Fatalf("Retry-After = %q, want the handler's default 7", got)
	}
	if !strings.Contains(he.Err.Error(), "kind is not configured") {
		t.Fatalf("message %q does not say the kind is not configured", he.Err)
	}
}
