package lchat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"

	"github.com/lchat/lchat-caddy/internal/safego"
)

func init() {
	caddy.RegisterModule(MeshAPI{})
	httpcaddyfile.RegisterHandlerDirective("lchat_mesh_api", parseMeshAPI)
	httpcaddyfile.RegisterDirectiveOrder("lchat_mesh_api", httpcaddyfile.Before, "redir")
}

// MeshAPI serves the peer endpoints of the mesh on this box's SELF site, each behind
// the mesh token (bearer, constant-time compare): PUT and DELETE /api/mesh/route/{host}
// (replicate a row, tombstone it), GET /api/mesh/routes (this box's in-scope rows) and
// GET /api/mesh/status. Other paths go to the next handler.
type MeshAPI struct {
	// MaxRowBytes bounds a replicated row's body. Default 256 KiB.
	MaxRowBytes int64 `json:"max_row_bytes,omitempty"`

	app    *App
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (MeshAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.lchat_mesh_api",
		New: func() caddy.Module { return new(MeshAPI) },
	}
}

// Provision finds the lchat app.
func (h *MeshAPI) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	appIface, err := ctx.App("lchat")
	if err != nil {
		return fmt.Errorf("getting lchat app: %v", err)
	}
	h.app = appIface.(*App)
	if h.MaxRowBytes <= 0 {
		h.MaxRowBytes = mesh.DefaultMaxRowBytes
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *MeshAPI) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	p := r.URL.Path
	if p != mesh.PathRoutes && p != mesh.PathStatus && !strings.HasPrefix(p, mesh.PathRoute) {
		return next.ServeHTTP(w, r)
	}
	ms := h.app.shared.mesh
	if ms == nil {
		return caddyhttp.Error(http.StatusNotFound, errMeshOff)
	}
	if !mesh.Authorize(r, ms.cfg.Token) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lchat mesh"`)
		return caddyhttp.Error(http.StatusUnauthorized, errors.New("mesh token missing or wrong"))
	}
	switch {
	case p == mesh.PathRoutes && r.Method == http.MethodGet:
		rows, err := h.app.inScopeRows()
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		return mesh.WriteRoutes(w, rows)
	case p == mesh.PathStatus && r.Method == http.MethodGet:
		return writeJSON(w, http.StatusOK, h.app.meshStatus())
	case strings.HasPrefix(p, mesh.PathRoute) && r.Method == http.MethodPut:
		return h.putRoute(w, r)
	case strings.HasPrefix(p, mesh.PathRoute) && r.Method == http.MethodDelete:
		return h.deleteRoute(w, r)
	}
	return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s %s", r.Method, p))
}

func (h *MeshAPI) putRoute(w http.ResponseWriter, r *http.Request) error {
	ms := h.app.shared.mesh
	row, err := mesh.DecodeRow(r, h.MaxRowBytes)
	if err != nil {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if !row.InScopeFor(ms.cfg.Domains, ms.cfg.Region) {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("route %s is outside this box's mesh domains and region", row.Host))
	}
	if row.LivesAt == ms.cfg.Self {
		// A live space pinned to this very box: its row here (with the real upstream)
		// is the original; a peer's copy of it changes nothing.
		return writeJSON(w, http.StatusOK, map[string]string{"kept": row.Host})
	}
	if !row.Hibernate && !ms.isLiveMember(row.LivesAt) {
		// Every request for the host would be forwarded there, with the Host kept and a
		// marker made with the mesh token: only a box of this mesh may be named, never
		// an arbitrary address (a metadata service, an internal host).
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusConflict, fmt.Errorf("route %s: lives_at %s is not a live box of this mesh", row.Host, row.LivesAt))
	}
	rt := routeFromRow(row)
	if err := h.app.checkRoute(&rt); err != nil {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	prev, hadPrev := h.app.shared.reg.Lookup(rt.Host)
	if hadPrev && !prev.Hibernate && prev.LivesAt == "" {
		// This box runs the host live from a local upstream; a peer cannot take that over.
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusConflict, fmt.Errorf("route %s is a live route served by this box", rt.Host))
	}
	stored, err := h.app.shared.reg.Put(rt)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	ms.c.rowsIn.Add(1)
	if !stored.Hibernate {
		// Pinned to another box now: a copy awake here must go to sleep (checkpoint and
		// release) so that box can take it.
		eng := h.app.shared.eng
		safego.Go(nil, h.logger, "sleep pinned space", func() {
			ctx, cancel := context.WithTimeout(ms.ctx, time.Minute)
			defer cancel()
			if err := eng.Sleep(ctx, stored.Host); err != nil {
				h.logger.Warn("sleeping a space pinned elsewhere", zap.String("host", stored.Host), zap.Error(err))
			}
		})
	}
	h.logger.Info("route replicated from a peer", zap.String("host", stored.Host), zap.String("kind", stored.Kind),
		zap.Bool("hibernate", stored.Hibernate), zap.String("home_region", stored.HomeRegion),
		zap.String("lives_at", stored.LivesAt), zap.Strings("env_names", stored.Summary().EnvNames))
	return writeJSON(w, http.StatusOK, stored.Summary())
}

func (h *MeshAPI) deleteRoute(w http.ResponseWriter, r *http.Request) error {
	ms := h.app.shared.mesh
	host, ok := mesh.HostFromPath(r.URL.Path)
	if !ok {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("no valid host in the path"))
	}
	if err := registry.ValidateHost(host); err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	rt, ok := h.app.shared.reg.Lookup(host)
	if ok && !rt.Hibernate && rt.LivesAt == "" {
		return caddyhttp.Error(http.StatusConflict, fmt.Errorf("route %s is a live route served by this box", host))
	}
	// Like a PUT, a tombstone outside this box's scope changes nothing: a host outside
	// the mesh domains is this box's own business unless its stored row is homed in
	// this box's region.
	homeRegion := ""
	if ok {
		homeRegion = rt.HomeRegion
	}
	if !ms.inScope(host, homeRegion) {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("route %s is outside this box's mesh domains and region", host))
	}
	err := h.app.shared.reg.Delete(host)
	if err != nil && !errors.Is(err, registry.ErrNotFound) {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	existed := err == nil
	// Stop the space if it runs here and drop its local state; its data in the bucket stays.
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	if ferr := h.app.shared.eng.Forget(ctx, host); ferr != nil {
		h.logger.Warn("tombstone: stopping the space", zap.String("host", host), zap.Error(ferr))
	}
	ms.c.tombstonesIn.Add(1)
	if existed {
		h.logger.Info("route tombstoned by a peer", zap.String("host", host))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"removed": host, "existed": existed})
}

// isLiveMember reports whether self is the SELF of a live box in this box's view.
func (ms *meshState) isLiveMember(self string) bool {
	if ms.m == nil {
		return false
	}
	for _, m := range ms.m.Live() {
		if m.Self == self {
			return true
		}
	}
	return false
}

// routeFromRow is the registry form of a replicated row. A live space pinned to a
// peer becomes a lives_at row with no upstream: the handler forwards it to LivesAt
// and never dials anything for it locally.
func routeFromRow(row mesh.RouteRow) registry.Route {
	return registry.Route{
		Host:       row.Host,
		Kind:       row.Kind,
		Version:    row.Version,
		Hibernate:  row.Hibernate,
		HomeRegion: row.HomeRegion,
		Env:        row.Env,
		LivesAt:    row.LivesAt,
	}
}

// rowFromRoute is the replicated form of a registry row on this box.
func (ms *meshState) rowFromRoute(rt *registry.Route) mesh.RouteRow {
	row := mesh.RouteRow{
		Host:       rt.Host,
		Kind:       rt.Kind,
		Version:    rt.Version,
		Hibernate:  rt.Hibernate,
		HomeRegion: rt.HomeRegion,
		Env:        rt.Env,
	}
	if !rt.Hibernate {
		row.LivesAt = rt.LivesAt
		if row.LivesAt == "" {
			row.LivesAt = ms.cfg.Self
		}
	}
	return row
}

// allRows is every row of this box in replicated form, env values included (they go
// to the peer only, never to the operator). A failed registry read is an error, never
// a shorter list: peers diff against it.
func (a *App) allRows() ([]mesh.RouteRow, error) {
	ms := a.shared.mesh
	var out []mesh.RouteRow
	after := ""
	for {
		rts, next, err := a.shared.reg.List(after, 1000)
		if err != nil {
			return nil, fmt.Errorf("listing routes: %v", err)
		}
		for i := range rts {
			out = append(out, ms.rowFromRoute(&rts[i]))
		}
		if next == "" {
			return out, nil
		}
		after = next
	}
}

// inScopeRows lists the rows of this box in its mesh scope (its domains, or its region
// as home_region), without env values: GET /api/mesh/routes.
func (a *App) inScopeRows() ([]mesh.RouteRow, error) {
	ms := a.shared.mesh
	rows, err := a.allRows()
	if err != nil {
		return nil, err
	}
	out := rows[:0]
	for _, row := range rows {
		if row.InScopeFor(ms.cfg.Domains, ms.cfg.Region) {
			row.Env = nil
			out = append(out, row)
		}
	}
	return out, nil
}

// meshFanout replicates a created or changed row to every live peer that covers the
// host or owns it by region, in the background: it never blocks the caller.
func (a *App) meshFanout(rt registry.Route) {
	ms := a.shared.mesh
	if ms == nil {
		return
	}
	targets := mesh.Targets(rt.Host, rt.HomeRegion, ms.m.Live(), ms.cfg.Self)
	if len(targets) == 0 {
		return
	}
	ms.count(ms.client.Fanout(ms.ctx, ms.rowFromRoute(&rt), targets))
}

// meshTombstone fans a deletion out like meshFanout.
func (a *App) meshTombstone(host, homeRegion string) {
	ms := a.shared.mesh
	if ms == nil {
		return
	}
	targets := mesh.Targets(host, homeRegion, ms.m.Live(), ms.cfg.Self)
	if len(targets) == 0 {
		return
	}
	ms.count(ms.client.FanoutDelete(ms.ctx, host, targets))
}

// count tallies fan-out results as they arrive (the client logs each one).
func (ms *meshState) count(results <-chan mesh.FanoutResult) {
	go func() {
		for res := range results {
			ms.c.fanouts.Add(1)
			if res.Err != nil {
				ms.c.fanoutErrors.Add(1)
			}
		}
	}()
}

// MeshStatus is this box's status document (GET /api/mesh/status), aggregated by
// GET /lchat/fleet. It holds no secret.
type MeshStatus struct {
	Self         string            `json:"self"`
	Region       string            `json:"region,omitempty"`
	Domains      []string          `json:"domains"`
	Version      string            `json:"version"`
	Incarnation  string            `json:"incarnation"`
	HeartbeatAge string            `json:"heartbeat_age"`
	Fenced       bool              `json:"fenced"`
	Draining     bool              `json:"draining"`
	Routes       int               `json:"routes"`
	Awake        []string          `json:"awake"`
	Live         []string          `json:"live_members"`
	Counters     map[string]uint64 `json:"counters"`
	Membership   any               `json:"membership"`
}

func (a *App) meshStatus() MeshStatus {
	ms := a.shared.mesh
	self := ms.m.Self()
	st := MeshStatus{
		Self:         ms.cfg.Self,
		Region:       ms.cfg.Region,
		Domains:      ms.cfg.Domains,
		Version:      ms.version,
		Incarnation:  ms.m.Config().Incarnation,
		HeartbeatAge: self.Age.Round(time.Millisecond).String(),
		Fenced:       ms.m.Fenced(),
		Draining:     ms.m.Draining(),
		Routes:       a.shared.reg.Len(),
		Awake:        []string{},
		Counters:     ms.c.snapshot(),
		Membership:   ms.m.Stats(),
	}
	for _, s := range a.shared.eng.Status() {
		if s.State == engine.StateAwake {
			st.Awake = append(st.Awake, s.Host)
		}
	}
	for _, m := range ms.m.Live() {
		st.Live = append(st.Live, m.Self)
	}
	ec := a.shared.eng.Counters()
	st.Counters["wakes"] = ec.Wakes
	st.Counters["lease_conflicts"] = ec.LeaseConflicts
	st.Counters["sleeps"] = ec.Sleeps
	return st
}

// parseMeshAPI sets up the handler from the `lchat_mesh_api` directive.
//
// Syntax:
//
//	lchat_mesh_api {
//		max_row_bytes <n>
//	}
func parseMeshAPI(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(MeshAPI)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens; see parseMeshAPI.
func (h *MeshAPI) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "max_row_bytes":
			var s string
			if err := caddyfileutil.OneArg(d, &s); err != nil {
				return err
			}
			var n int64
			if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
				return d.Errf("max_row_bytes: want a positive number, got %q", s)
			}
			h.MaxRowBytes = n
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*MeshAPI)(nil)
	_ caddyhttp.MiddlewareHandler = (*MeshAPI)(nil)
	_ caddyfile.Unmarshaler       = (*MeshAPI)(nil)
)
