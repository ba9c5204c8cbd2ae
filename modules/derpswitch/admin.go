package derpswitch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/derpswitch"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the derp_switch endpoints on Caddy's admin API:
//
//	GET  /derp_switch/status
//	POST /derp_switch/settings   {"derp_region": N}   (0 clears the pin)
//
// It serves the running app (the last one started), not the app of the config it was
// provisioned with: Caddy replaces the admin server before it provisions a new config's
// apps, and keeps that admin server when the new config then fails, while the previous
// config (and its app) keeps running.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.derp_switch",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/derp_switch/status", Handler: caddy.AdminHandlerFunc(a.handleStatus)},
		{Pattern: "/derp_switch/settings", Handler: caddy.AdminHandlerFunc(a.handleSettings)},
	}
}

func (a *adminAPI) handleStatus(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	app := runningApp()
	if app == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("derp_switch app is not running")}
	}
	return writeJSON(w, app.Switcher().Status())
}

type settingsRequest struct {
	DERPRegion *int `json:"derp_region"`
}

func (a *adminAPI) handleSettings(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	app := runningApp()
	if app == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("derp_switch app is not running")}
	}
	region, err := decodeSettings(r.Body)
	if err != nil {
		return settingsRefused(err)
	}
	if err := app.SetPin(r.Context(), region); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, derpswitch.ErrUnknownRegion) {
			status = http.StatusBadRequest
		}
		return caddy.APIError{HTTPStatus: status, Err: err}
	}
	return writeJSON(w, app.Switcher().Status())
}

// maxSettingsBody bounds a POST /derp_switch/settings body.
const maxSettingsBody = 1 << 16

// decodeSettings decodes a POST /derp_switch/settings body: exactly one JSON object with
// a "derp_region" and nothing else. A body adminapi.Decode refuses is its *BodyError.
func decodeSettings(body io.Reader) (int, error) {
	var req settingsRequest
	if err := adminapi.Decode(body, maxSettingsBody, &req); err != nil {
		return 0, err
	}
	if req.DERPRegion == nil {
		return 0, errors.New(`missing "derp_region"`)
	}
	return *req.DERPRegion, nil
}

// settingsRefused is the answer to a body decodeSettings refused: its adminapi.BodyError
// status, else 400.
func settingsRefused(err error) error {
	status := http.StatusBadRequest
	var be *adminapi.BodyError
	if errors.As(err, &be) {
		status = be.Status
	}
	return caddy.APIError{HTTPStatus: status, Err: err}
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
)
