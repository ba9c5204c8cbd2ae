package lchat

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/ledger"
)

func init() {
	caddy.RegisterModule(idsAdmin{})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "next-id",
		Usage: "[--address <admin>]",
		Short: "Allocates the next id from the shared id ledger",
		Long: `
Prints the next id of the namespace in the running server's LCHAT_CLOUD_ID_LEDGER,
drawn from ledger/<namespace> in its bucket: unique across every box on that bucket,
never reused. Fails when the server runs without LCHAT_CLOUD_ID_LEDGER.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Args = cobra.NoArgs
			addAdminFlags(cmd)
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdNextID)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "seed-ids",
		Usage: "<min> [--address <admin>]",
		Short: "Makes every later id of the shared id ledger at least <min>",
		Long: `
Seeds the running server's id ledger (LCHAT_CLOUD_ID_LEDGER) so every id handed out
afterwards is at least <min>: run it with one above the highest id minted before the
ledger was switched on. It refuses to lower the counter and then changes nothing.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Args = cobra.ExactArgs(1)
			addAdminFlags(cmd)
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdSeedIDs)
		},
	})
}

func cmdNextID(fs caddycmd.Flags) (int, error) {
	var res IDResult
	if err := adminCall(fs, http.MethodPost, "/lchat/ids", nil, &res); err != nil {
		return cliErr(err)
	}
	fmt.Println(res.ID)
	return caddy.ExitCodeSuccess, nil
}

func cmdSeedIDs(fs caddycmd.Flags) (int, error) {
	min, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil || min == 0 {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("<min> must be a positive integer, got %q", fs.Arg(0))
	}
	var res SeedIDsResult
	if err := adminCall(fs, http.MethodPost, "/lchat/ids/seed", seedIDsRequest{Min: min}, &res); err != nil {
		return cliErr(err)
	}
	fmt.Printf("id ledger %s: the next id is %d\n", res.Namespace, res.Next)
	return caddy.ExitCodeSuccess, nil
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

// IDResult is the answer of POST /lchat/ids.
type IDResult struct {
	Namespace string `json:"namespace"`
	ID        uint64 `json:"id"`
}

// seedIDsRequest is the POST /lchat/ids/seed body: every id handed out afterwards is
// at least Min.
type seedIDsRequest struct {
	Min uint64 `json:"min"`
}

// SeedIDsResult is the answer of POST /lchat/ids/seed.
type SeedIDsResult struct {
	Namespace string `json:"namespace"`
	// Next is the lowest id the ledger may hand out now.
	Next uint64 `json:"next"`
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
		return writeJSON(w, http.StatusOK, IDResult{Namespace: a.namespace, ID: id})
	case "/lchat/ids/seed":
		var req seedIDsRequest
		if err := decodeStrict(r, &req); err != nil {
			return err
		}
		next, err := a.app.box.SeedIDs(r.Context(), a.namespace, req.Min)
		if err != nil {
			return boxErr(err)
		}
		return writeJSON(w, http.StatusOK, SeedIDsResult{Namespace: a.namespace, Next: next})
	}
	return apiErr(http.StatusNotFound, "resource not found: %s %s", r.Method, r.URL.Path)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*idsAdmin)(nil)
	_ caddy.Provisioner = (*idsAdmin)(nil)
)
