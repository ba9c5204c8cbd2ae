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

// idLedgerFromEnv is the id-ledger namespace LCHAT_CLOUD_ID_LEDGER names, "" when it is
// unset. It is the one reader of the variable (App.Provision calls it; the box and the id
// endpoints take the namespace from the App's settings), so a namespace the ledger would
// refuse fails the config load, even of a config that is only validated or runs without
// the admin API, rather than every later allocation.
func idLedgerFromEnv() (string, error) {
	ns := strings.TrimSpace(os.Getenv(envIDLedger))
	if ns == "" {
		return "", nil
	}
	if _, err := ledger.New(nil, ns, ledger.Options{}); err != nil {
		return "", fmt.Errorf("%s: %v", envIDLedger, err)
	}
	return ns, nil
}

// idsAdmin serves the id ledger on Caddy's admin API: POST /lchat/ids allocates the
// next id of the namespace in LCHAT_CLOUD_ID_LEDGER, POST /lchat/ids/seed raises the
// counter above ids minted before the ledger was switched on.
type idsAdmin struct{ appRef }

// CaddyModule returns the Caddy module information.
func (idsAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat_ids",
		New: func() caddy.Module { return new(idsAdmin) },
	}
}

// Routes returns the admin routes.
func (a *idsAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/lchat/ids", Handler: caddy.AdminHandlerFunc(a.serve)},
		{Pattern: "/lchat/ids/", Handler: caddy.AdminHandlerFunc(a.serve)},
	}
}

func (a *idsAdmin) serve(w http.ResponseWriter, r *http.Request) error {
	if err := a.configured(); err != nil {
		return err
	}
	ns := a.app.settings.IDLedger
	if ns == "" {
		return apiErr(http.StatusNotFound, "the id ledger is off on this box (%s is not set)", envIDLedger)
	}
	if r.Method != http.MethodPost {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	switch r.URL.Path {
	case "/lchat/ids":
		id, err := a.app.box.NextID(r.Context(), ns)
		if err != nil {
			return boxErr(err)
		}
		return writeJSON(w, http.StatusOK, adminapi.IDResult{Namespace: ns, ID: id})
	case "/lchat/ids/seed":
		var req adminapi.SeedIDsRequest
		if err := decodeStrict(r, &req); err != nil {
			return err
		}
		next, err := a.app.box.SeedIDs(r.Context(), ns, req.Min)
		if err != nil {
			return boxErr(err)
		}
		return writeJSON(w, http.StatusOK, adminapi.SeedIDsResult{Namespace: ns, Next: next})
	}
	return apiErr(http.StatusNotFound, "resource not found: %s %s", r.Method, r.URL.Path)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*idsAdmin)(nil)
	_ caddy.Provisioner = (*idsAdmin)(nil)
)
