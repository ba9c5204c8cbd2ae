package lchat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the operator endpoints under /lchat/ on Caddy's admin API. Route
// env values are accepted but never returned: responses carry env names only.
type adminAPI struct {
	app    *App
	logger *zap.Logger
	// cloudRegion is LCHAT_CLOUD_REGION: the home_region of a route created without one.
	cloudRegion string
}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Provision finds the lchat app if the config has one.
func (a *adminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a)
	if app, err := ctx.AppIfConfigured("lchat"); err == nil {
		a.app = app.(*App)
	}
	if r := strings.TrimSpace(os.Getenv(envCloudRegion)); r != "" {
		if err := registry.ValidateRegion(r); err != nil {
			return fmt.Errorf("%s: %v", envCloudRegion, err)
		}
		a.cloudRegion = r
	}
	return nil
}

// envCloudRegion stamps the home_region of spaces created on this box (region-scoped
// placement: a space is placed in its region from its first wake).
const envCloudRegion = "LCHAT_CLOUD_REGION"

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/lchat/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// maxBody bounds an admin request body.
const maxBody = 1 << 20

func apiErr(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	if a.app == nil || a.app.shared == nil {
		return apiErr(http.StatusNotFound, "the lchat app is not configured")
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
		case action != "" && action != "hibernate" && action != "history" && action != "restore":
			return apiErr(http.StatusNotFound, "resource not found: %s", r.URL.Path)
		}
	default:
		return apiErr(http.StatusNotFound, "resource not found: %s", r.URL.Path)
	}
	return apiErr(http.StatusMethodNotAllowed, "method not allowed: %s %s", r.Method, r.URL.Path)
}

// routesPage is the GET /lchat/routes response.
type routesPage struct {
	Routes []registry.Summary `json:"routes"`
	// Next is the `after` of the next page; empty on the last page.
	Next string `json:"next,omitempty"`
}

func (a *adminAPI) listRoutes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := registry.ParsePageLimit(q.Get("limit"))
	if err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	rts, next, err := a.app.shared.reg.List(q.Get("after"), limit)
	if err != nil {
		return apiErr(http.StatusInternalServerError, "%v", err)
	}
	page := routesPage{Routes: make([]registry.Summary, 0, len(rts)), Next: next}
	for i := range rts {
		page.Routes = append(page.Routes, rts[i].Summary())
	}
	return writeJSON(w, http.StatusOK, page)
}

// createRequest is the POST /lchat/routes body.
type createRequest struct {
	Host       string            `json:"host"`
	Kind       string            `json:"kind,omitempty"`
	Version    string            `json:"version,omitempty"`
	Hibernate  *bool             `json:"hibernate,omitempty"`
	HomeRegion string            `json:"home_region,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Upstream   string            `json:"upstream,omitempty"`
	// Mint names the host from the next id instead: <base36(id)>.<first wildcard
	// domain>, the id drawn from LCHAT_CLOUD_ID_LEDGER's ledger (a local counter
	// without it). Host must then be empty.
	Mint bool `json:"mint,omitempty"`
}

func decodeStrict(r *http.Request, v any) error {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return apiErr(http.StatusBadRequest, "reading request body: %v", err)
	}
	if len(raw) > maxBody {
		// Said as such: a truncated body would only read as "unexpected EOF".
		return apiErr(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			// Its message quotes a character of the body, which may be inside an env value.
			return apiErr(http.StatusBadRequest, "decoding request body: malformed JSON at byte %d", syn.Offset)
		}
		return apiErr(http.StatusBadRequest, "decoding request body: %v", err)
	}
	if dec.More() {
		return apiErr(http.StatusBadRequest, "decoding request body: trailing data after the JSON object")
	}
	return nil
}

func (a *adminAPI) createRoute(w http.ResponseWriter, r *http.Request) error {
	var req createRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	rt, err := registry.NewRoute(registry.Spec(req), a.cloudRegion)
	if err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	if req.Mint {
		return a.mintRoute(w, r, rt)
	}
	if err := a.app.checkRoute(&rt); err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	stored, err := a.app.shared.reg.Create(rt)
	if errors.Is(err, registry.ErrExists) {
		return apiErr(http.StatusConflict, "route %s exists; remove it first", rt.Host)
	}
	if err != nil {
		return apiErr(http.StatusInternalServerError, "%v", err)
	}
	a.logger.Info("route created", zap.String("host", stored.Host), zap.String("kind", stored.Kind),
		zap.Bool("hibernate", stored.Hibernate), zap.Strings("env_names", stored.Summary().EnvNames))
	a.app.meshFanout(stored)
	return writeJSON(w, http.StatusCreated, stored.Summary())
}

// mintRoute creates rt under a minted host (App.mintRoute) and answers like a create.
func (a *adminAPI) mintRoute(w http.ResponseWriter, r *http.Request, rt registry.Route) error {
	stored, err := a.app.mintRoute(r.Context(), rt)
	var invalid *mintInvalidError
	switch {
	case errors.As(err, &invalid):
		return apiErr(http.StatusBadRequest, "%v", err)
	case errors.Is(err, errNoMintDomain):
		return apiErr(http.StatusConflict, "%v", err)
	case err != nil:
		return apiErr(http.StatusServiceUnavailable, "minting a host: %v", err)
	}
	a.logger.Info("route created", zap.String("host", stored.Host), zap.Bool("minted", true), zap.String("kind", stored.Kind),
		zap.Bool("hibernate", stored.Hibernate), zap.Strings("env_names", stored.Summary().EnvNames))
	a.app.meshFanout(stored)
	return writeJSON(w, http.StatusCreated, stored.Summary())
}

func (a *adminAPI) getRoute(w http.ResponseWriter, host string) error {
	rt, err := a.app.shared.reg.Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return apiErr(http.StatusNotFound, "no route for host %s", host)
	}
	return writeJSON(w, http.StatusOK, rt.Summary())
}

func (a *adminAPI) deleteRoute(w http.ResponseWriter, r *http.Request, host string) error {
	err := a.app.removeRoute(r.Context(), host, r.URL.Query().Get("discard") == "true")
	if errors.Is(err, registry.ErrNotFound) {
		return apiErr(http.StatusNotFound, "no route for host %s", host)
	}
	if err != nil {
		return apiErr(http.StatusInternalServerError, "%v", err)
	}
	a.logger.Info("route removed", zap.String("host", host))
	return writeJSON(w, http.StatusOK, map[string]string{"removed": host})
}

// removeRoute deletes host's route (registry.ErrNotFound when it has none), saves and
// stops its space here (discard: stops it without saving) and tombstones the row on the
// peers. The admin API and the console share it.
func (a *App) removeRoute(ctx context.Context, host string, discard bool) error {
	rt, err := a.shared.reg.Get(host)
	if err != nil {
		return err
	}
	// Remove the row first so no new request wakes the space, then save and stop it
	// (Forget checkpoints first; Discard is the explicit choice not to), delete its
	// scheduled wake record and drop its local state. Its other bucket data stays. A
	// live route may have been a space before (hibernation turned off): Forget it too.
	if err := a.shared.reg.Delete(host); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	forget := a.shared.eng.Forget
	if discard {
		forget = a.shared.eng.Discard
	}
	err = forget(ctx, host)
	a.meshTombstone(host, rt.HomeRegion) // the route is gone here whatever the space's state
	if err != nil {
		return fmt.Errorf("route %s removed, but saving and stopping its space failed: %v", host, err)
	}
	return nil
}

// hibernateRequest is the POST /lchat/routes/{host}/hibernate body.
type hibernateRequest struct {
	Hibernate *bool `json:"hibernate"`
	// Upstream is the live upstream when turning hibernation off.
	Upstream string `json:"upstream,omitempty"`
}

func (a *adminAPI) setHibernate(w http.ResponseWriter, r *http.Request, host string) error {
	var req hibernateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	if req.Hibernate == nil {
		return apiErr(http.StatusBadRequest, `body must set "hibernate": true or false`)
	}
	cur, err := a.app.shared.reg.Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return apiErr(http.StatusNotFound, "no route for host %s", host)
	}
	next := registry.SetHibernate(cur, *req.Hibernate, req.Upstream)
	if err := a.app.checkRoute(&next); err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	stored, err := a.app.shared.reg.Update(host, func(rt *registry.Route) error {
		rt.Hibernate, rt.Upstream, rt.LivesAt = next.Hibernate, next.Upstream, next.LivesAt
		return nil
	})
	if err != nil {
		return apiErr(http.StatusInternalServerError, "%v", err)
	}
	if registry.StopsHibernating(cur, stored) {
		// The space is no longer this box's to run: checkpoint it and let go.
		ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
		defer cancel()
		if err := a.app.shared.eng.Sleep(ctx, host); err != nil {
			return apiErr(http.StatusInternalServerError, "route %s updated, but putting its space to sleep failed: %v", host, err)
		}
	}
	a.app.meshFanout(stored)
	return writeJSON(w, http.StatusOK, stored.Summary())
}

// spaceStatus is one space in GET /lchat/status.
type spaceStatus struct {
	Host          string     `json:"host"`
	Kind          string     `json:"kind"`
	State         string     `json:"state"`
	Since         time.Time  `json:"since"`
	PID           int        `json:"pid,omitempty"`
	LastSync      *time.Time `json:"last_sync,omitempty"`
	LastSyncError string     `json:"last_sync_error,omitempty"`
	LastCrash     string     `json:"last_crash,omitempty"`
}

// statusResponse is GET /lchat/status.
type statusResponse struct {
	Routes   int                `json:"routes"`
	Spaces   []spaceStatus      `json:"spaces"`
	Counters map[string]float64 `json:"counters"`
	Mesh     *MeshStatus        `json:"mesh,omitempty"`
}

func statusOf(eng *engine.Engine) []spaceStatus {
	st := eng.Status()
	out := make([]spaceStatus, 0, len(st))
	for _, s := range st {
		ss := spaceStatus{
			Host:          s.Host,
			Kind:          s.Kind,
			State:         fmt.Sprint(s.State),
			Since:         s.Since,
			PID:           s.PID,
			LastSyncError: s.LastSyncError,
			LastCrash:     s.LastCrash,
		}
		if !s.LastSync.IsZero() {
			t := s.LastSync
			ss.LastSync = &t
		}
		out = append(out, ss)
	}
	return out
}

func (a *adminAPI) status(w http.ResponseWriter) error {
	st := statusResponse{
		Routes:   a.app.shared.reg.Len(),
		Spaces:   statusOf(a.app.shared.eng),
		Counters: countersOf(a.app.shared.eng),
	}
	if a.app.shared.mesh != nil {
		ms := a.app.meshStatus()
		st.Mesh = &ms
	}
	return writeJSON(w, http.StatusOK, st)
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
