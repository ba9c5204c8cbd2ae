package lchat

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/internal/buildinfo"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the operator endpoints under /lchat/ on Caddy's admin API. Route
// env values are accepted but never returned: responses carry env names only.
type adminAPI struct{ appRef }

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/lchat/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// appRef is what each admin module of the lchat app holds: the app, found at Provision.
type appRef struct{ app *App }

// Provision finds the lchat app if the config has one.
func (r *appRef) Provision(ctx caddy.Context) error {
	if app, err := ctx.AppIfConfigured("lchat"); err == nil {
		r.app = app.(*App)
	}
	return nil
}

// configured is the admin answer when the config has no lchat app, nil when it has one.
func (r *appRef) configured() error {
	if r.app == nil || r.app.box == nil {
		return apiErr(http.StatusNotFound, "the lchat app is not configured")
	}
	return nil
}

// maxBody bounds an admin request body.
const maxBody = 1 << 20

func apiErr(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

// boxErr is the admin answer of the box's err (box.StatusOf).
func boxErr(err error) error {
	return caddy.APIError{HTTPStatus: box.StatusOf(err), Err: err}
}

func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	if err := a.configured(); err != nil {
		return err
	}
	path := strings.TrimPrefix(r.URL.Path, "/lchat/")
	switch {
	case path == "routes":
		switch r.Method {
		case http.MethodGet:
			return a.listRoutes(w, r)
		case http.MethodPost:
			return a.createRoute(w, r)
		}
	case path == "status":
		if r.Method == http.MethodGet {
			return a.status(w)
		}
	case path == "spaces":
		if r.Method == http.MethodGet {
			return a.spaces(w, r)
		}
	case strings.HasPrefix(path, "routes/"):
		rest := strings.TrimPrefix(path, "routes/")
		host, action, _ := strings.Cut(rest, "/")
		if err := registry.ValidateHost(host); err != nil {
			return apiErr(http.StatusBadRequest, "%v", err)
		}
		switch {
		case action == "" && r.Method == http.MethodGet:
			return a.getRoute(w, host)
		case action == "" && r.Method == http.MethodDelete:
			return a.deleteRoute(w, r, host)
		case action == "hibernate" && r.Method == http.MethodPost:
			return a.setHibernate(w, r, host)
		case action == "history" && r.Method == http.MethodGet:
			return a.history(w, r, host)
		case action == "restore" && r.Method == http.MethodPost:
			return a.restore(w, r, host)
		case action == "sleep" && r.Method == http.MethodPost:
			return a.sleep(w, r, host)
		case action == "wake" && r.Method == http.MethodPost:
			return a.wake(w, r, host)
		case !slices.Contains([]string{"", "hibernate", "history", "restore", "sleep", "wake"}, action):
			return apiErr(http.StatusNotFound, "resource not found: %s", r.URL.Path)
		}
	default:
		return apiErr(http.StatusNotFound, "resource not found: %s", r.URL.Path)
	}
	return apiErr(http.StatusMethodNotAllowed, "method not allowed: %s %s", r.Method, r.URL.Path)
}

func (a *adminAPI) listRoutes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := registry.ParsePageLimit(q.Get("limit"))
	if err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	rts, next, err := a.app.box.Registry().List(q.Get("after"), limit)
	if err != nil {
		return apiErr(http.StatusInternalServerError, "%v", err)
	}
	page := adminapi.RoutesPage{Routes: make([]registry.Summary, 0, len(rts)), Next: next}
	for i := range rts {
		page.Routes = append(page.Routes, rts[i].Summary())
	}
	return writeJSON(w, http.StatusOK, page)
}

// decodeStrict decodes r's body into v (adminapi.Decode) and answers a refused one with
// its status.
func decodeStrict(r *http.Request, v any) error {
	err := adminapi.Decode(r.Body, maxBody, v)
	var be *adminapi.BodyError
	if errors.As(err, &be) {
		return caddy.APIError{HTTPStatus: be.Status, Err: be}
	}
	return err
}

func (a *adminAPI) createRoute(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.CreateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	// HostedFor stays empty: only a provider's API hosts a space for another fleet.
	stored, err := a.app.box.Create(r.Context(), registry.Spec{Host: req.Host, Kind: req.Kind, Version: req.Version,
		Hibernate: req.Hibernate, HomeRegion: req.HomeRegion, Env: req.Env, Upstream: req.Upstream, Mint: req.Mint})
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusCreated, stored.Summary())
}

func (a *adminAPI) getRoute(w http.ResponseWriter, host string) error {
	rt, err := a.app.box.Registry().Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return apiErr(http.StatusNotFound, "no route for host %s", host)
	}
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, rt.Summary())
}

func (a *adminAPI) deleteRoute(w http.ResponseWriter, r *http.Request, host string) error {
	if err := a.app.box.Remove(r.Context(), host, r.URL.Query().Get("discard") == "true"); err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, map[string]string{"removed": host})
}

func (a *adminAPI) setHibernate(w http.ResponseWriter, r *http.Request, host string) error {
	var req adminapi.HibernateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	if req.Hibernate == nil {
		return apiErr(http.StatusBadRequest, `body must set "hibernate": true or false`)
	}
	stored, err := a.app.box.SetHibernate(r.Context(), host, *req.Hibernate, req.Upstream)
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, stored.Summary())
}

func (a *adminAPI) status(w http.ResponseWriter) error {
	return writeJSON(w, http.StatusOK, statusWithProviders{adminapi.Status{Version: buildinfo.String(), Status: a.app.box.Status()}, a.app.providerStatus()})
}

// spaces answers GET /lchat/spaces[?host=H][&stored=false]: every route, or H's alone,
// with its state and, unless stored=false, its last checkpoint (box.SpaceReports).
func (a *adminAPI) spaces(w http.ResponseWriter, r *http.Request) error {
	host := r.URL.Query().Get("host")
	if host != "" {
		if err := registry.ValidateHost(host); err != nil {
			return apiErr(http.StatusBadRequest, "%v", err)
		}
	}
	rep, err := a.app.box.SpaceReports(r.Context(), host, r.URL.Query().Get("stored") != "false")
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, adminapi.Spaces{Spaces: rep})
}

// sleep answers POST /lchat/routes/{host}/sleep: the console's "hibernate now"
// (box.Box.SleepNow, through box.Console as the console calls it).
func (a *adminAPI) sleep(w http.ResponseWriter, r *http.Request, host string) error {
	if err := a.app.box.Console().Hibernate(r.Context(), host); err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, map[string]string{"asleep": host})
}

// wake answers POST /lchat/routes/{host}/wake (box.Box.WakeNow).
func (a *adminAPI) wake(w http.ResponseWriter, r *http.Request, host string) error {
	if err := a.app.box.WakeNow(r.Context(), host); err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, map[string]string{"awake": host})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
	_ caddy.Provisioner = (*adminAPI)(nil)
)
