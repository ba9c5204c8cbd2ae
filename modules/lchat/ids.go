package lchat

import (
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/ledger"
)

func init() {
	caddy.RegisterModule(idsAdmin{})
}

// envIDLedger names the id-ledger namespace. Set, every box on the bucket draws ids
// from ledger/<namespace>; unset, the id endpoints are off.
const envIDLedger = "LCHAT_CLOUD_ID_LEDGER"

// idsAdmin serves the id ledger on Caddy's admin API: POST /lchat/ids allocates the
// next id of the namespace in LCHAT_CLOUD_ID_LEDGER, POST /lchat/ids/seed raises the
// counter above ids minted before the ledger was switched on.
type idsAdmin struct {
	app       *App
	namespace string
}

// CaddyModule returns the Caddy module information.
func (idsAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat_ids",
		New: func() caddy.Module { return new(idsAdmin) },
	}
}

// Provision reads LCHAT_CLOUD_ID_LEDGER and finds the lchat app. A namespace the
// ledger would refuse fails the config load, rather than every later allocation.
func (a *idsAdmin) Provision(ctx caddy.Context) error {
	if app, err := ctx.AppIfConfigured("lchat"); err == nil {
		a.app = app.(*App)
	}
	a.namespace = strings.TrimSpace(os.Getenv(envIDLedger))
	if a.namespace != "" {
		if _, err := ledger.New(nil, a.namespace, ledger.Options{}); err != nil {
			return fmt.Errorf("%s: %v", envIDLedger, err)
		}
	}
	return nil
}

// Routes returns the admin routes.
func (a *idsAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/lchat/ids", Handler: caddy.AdminHandlerFunc(a.serve)},
		{Pattern: "/lchat/ids/", Handler: caddy.AdminHandlerFunc(a.serve)},
	}
}

func (a *idsAdmin) serve(w http.ResponseWriter, r *http.Request) error {
	if a.namespace == "" {
		return apiErr(http.StatusNotFound, "the id ledger is off on this box (%s is not set)", envIDLedger)
	}
	if a.app == nil || a.app.box == nil {
		return apiErr(http.StatusNotFound, "the lchat app is not configured")
	}
	if r.Method != http.MethodPost {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	switch r.URL.Path {
	case "/lchat/ids":
		id, err := a.app.box.NextID(r.Context(), a.namespace)
		if err != nil {
			return boxErr(err)
		}
		return writeJSON(w, http.StatusOK, adminapi.IDResult{Namespace: a.namespace, ID: id})
	case "/lchat/ids/seed":
		var req adminapi.SeedIDsRequest
		if err := decodeStrict(r, &req); err != nil {
			return err
		}
		next, err := a.app.box.SeedIDs(r.Context(), a.namespace, req.Min)
		if err != nil {
			return boxErr(err)
		}
		return writeJSON(w, http.StatusOK, adminapi.SeedIDsResult{Namespace: a.namespace, Next: next})
	}
	return apiErr(http.StatusNotFound, "resource not found: %s %s", r.Method, r.URL.Path)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*idsAdmin)(nil)
	_ caddy.Provisioner = (*idsAdmin)(nil)
)
