package lchat

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Health{})
}

// Health is http.handlers.lchat_health, the load balancer's health check of this box:
// 200 while the box serves (box.Box.Health), 503 while it starts, is fenced, drains
// (from the first moment of a process exit, before its listeners close) or is closed.
// The body is one JSON object naming the state, for people reading the check; a
// balancer reads the status only.
type Health struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (Health) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.lchat_health",
		New: func() caddy.Module { return new(Health) },
	}
}

// Provision finds the lchat app.
func (h *Health) Provision(ctx caddy.Context) error {
	appIface, err := ctx.App("lchat")
	if err != nil {
		return fmt.Errorf("getting lchat app: %v", err)
	}
	h.app = appIface.(*App)
	return nil
}

// ServeHTTP answers the check; it never calls next.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	state, ok := "starting", false
	if b := h.app.box; b != nil {
		s, serving := b.Health()
		state, ok = s.String(), serving
	}
	// The box's exit watch polls; Caddy's own flag turns the check at the signal itself.
	if caddy.Exiting() {
		state, ok = "draining", false
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		fmt.Fprintf(w, "{\"state\":%q}\n", state)
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Health)(nil)
	_ caddyhttp.MiddlewareHandler = (*Health)(nil)
)
