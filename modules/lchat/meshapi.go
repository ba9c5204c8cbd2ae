package lchat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"

	"github.com/lchat/lchat-caddy/internal/safego"
)

func init() {
	caddy.RegisterModule(MeshAPI{})
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
		rows, err := ms.box.InScopeRows(h.app.shared.reg)
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
	prev, _ := h.app.shared.reg.Lookup(row.Host)
	rt, err := ms.box.AcceptRow(row, prev, h.app.checkRoute)
	if errors.Is(err, mesh.ErrKept) {
		return writeJSON(w, http.StatusOK, map[string]string{"kept": row.Host})
	}
	if err != nil {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(refusedStatus(err), err)
	}
	// A row with a revision is stored only if it is newer than the row or tombstone
	// held here (registry/version.go); one without comes from a box that predates
	// revisions and is stored as before, with no revision (any versioned change wins).
	stored, err := h.app.shared.reg.ApplyReplicated(rt)
	if errors.Is(err, registry.ErrStale) {
		ms.c.rowsStale.Add(1)
		return writeJSON(w, http.StatusOK, map[string]string{"stale": row.Host})
	}
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
	prev, _ := h.app.shared.reg.Lookup(host)
	if err := ms.box.AcceptTombstone(host, prev); err != nil {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(refusedStatus(err), err)
	}
	existed, err := h.app.shared.reg.RemoveReplicated(host, r.Header.Get(mesh.RevHeader))
	if errors.Is(err, registry.ErrInvalidRev) {
		ms.c.rowsRejected.Add(1)
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if errors.Is(err, registry.ErrStale) {
		// The row here is newer than this tombstone (a re-create): it stays.
		ms.c.rowsStale.Add(1)
		return writeJSON(w, http.StatusOK, map[string]any{"stale": host})
	}
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
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

// refusedStatus is the HTTP status of a refused row or tombstone.
func refusedStatus(err error) int {
	var re *mesh.RefusedError
	if errors.As(err, &re) && re.Conflict {
		return http.StatusConflict
	}
	return http.StatusBadRequest
}

// meshFanout replicates a created or changed row to the peers, in the background.
func (a *App) meshFanout(rt registry.Route) {
	if ms := a.shared.mesh; ms != nil {
		ms.repl.Put(rt)
	}
}

// meshTombstone fans a deletion out like meshFanout, with the tombstone's revision.
func (a *App) meshTombstone(host, homeRegion string) {
	if ms := a.shared.mesh; ms != nil {
		rev, _ := a.shared.reg.TombstoneRev(host)
		ms.repl.Delete(host, homeRegion, rev)
	}
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
		Awake:        awakeHosts(a.shared.eng),
		Counters:     ms.counters(),
		Membership:   ms.m.Stats(),
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

// Interface guards
var (
	_ caddy.Provisioner           = (*MeshAPI)(nil)
	_ caddyhttp.MiddlewareHandler = (*MeshAPI)(nil)
)
