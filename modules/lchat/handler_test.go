package lchat

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/registry"
)

// TestKindRemovedIs503WithRetryAfter: a route whose kind a reload removed answers 503
// with a Retry-After (the handler's default) and a message saying why.
func TestKindRemovedIs503WithRetryAfter(t *testing.T) {
	dir := t.TempDir()
	reg, err := registry.Open(filepath.Join(dir, "reg.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	b, err := filebucket.New(filepath.Join(dir, "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Bucket: b, StateDir: filepath.Join(dir, "s"), Holder: "box", Incarnation: "1",
		Kinds: map[string]engine.Kind{"other": {Command: "/bin/true"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	const host = "gone.example.com"
	if _, err := reg.Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: &App{shared: &shared{reg: reg, eng: eng}}, logger: zap.NewNop()}
	w := httptest.NewRecorder()
	req := caddyhttp.PrepareRequest(httptest.NewRequest("GET", "http://"+host+"/", nil), caddy.NewReplacer(), w, &caddyhttp.Server{})
	err = h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
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
