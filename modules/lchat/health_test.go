package lchat

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lchat/lchat-caddy/box/boxtest"
)

// TestHealthAnswers: the balancer's check answers 200 while the box serves, 503 naming
// the state before the box is there and from the drain on; HEAD answers the same without
// a body.
func TestHealthAnswers(t *testing.T) {
	h := &Health{app: &App{}}
	check := func(method string, wantCode int, wantBody string) {
		t.Helper()
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, httptest.NewRequest(method, "/", nil), nil); err != nil {
			t.Fatal(err)
		}
		if rec.Code != wantCode || strings.TrimSpace(rec.Body.String()) != wantBody {
			t.Fatalf("%s: %d %q, want %d %q", method, rec.Code, rec.Body.String(), wantCode, wantBody)
		}
		if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
			t.Fatalf("Cache-Control %q", cc)
		}
	}
	check("GET", http.StatusServiceUnavailable, `{"state":"starting"}`)
	b := boxtest.Open(t, boxtest.Options{})
	h.app.box = b
	check("GET", http.StatusOK, `{"state":"serving"}`)
	check("HEAD", http.StatusOK, "")
	b.Drain()
	check("GET", http.StatusServiceUnavailable, `{"state":"draining"}`)
}

func TestHealthCaddyfile(t *testing.T) {
	for in, wantErr := range map[string]string{
		"lchat_health":                 "",
		"lchat_health now":             "lchat_health takes no arguments",
		"lchat_health {\n\tverbose\n}": "lchat_health takes no arguments",
	} {
		_, err := parseHealth(httpcaddyfile.Helper{Dispenser: caddyfile.NewTestDispenser(in)})
		if (err == nil) != (wantErr == "") || (err != nil && !strings.Contains(err.Error(), wantErr)) {
			t.Errorf("%q: %v, want %q", in, err, wantErr)
		}
	}
}
