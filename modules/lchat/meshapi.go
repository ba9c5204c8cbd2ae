package lchat

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/standby"
)

func init() {
	caddy.RegisterModule(MeshAPI{})
}

// MeshAPI serves the peer endpoints of the mesh on this box's SELF site, each behind
// the mesh token (bearer, constant-time compare): PUT and DELETE /api/mesh/route/{host}
// (replicate a row, tombstone it), GET /api/mesh/routes (this box's in-scope rows) and
// GET /api/mesh/status, the held connections' calls under /api/mesh/conns/
// (held.Conns.ServePeer), the standby's spool under /api/mesh/standby/
// (standby.Spool.ServePeer), POST /api/mesh/release/{host} from a standby leaving the
// fleet (standby.ServeRelease, engine.Engine.ReleaseStandby), and GET /api/mesh/watch,
// held open by the boxes that stand by for this one's spaces (box.Box.ServeWatch). Other
// paths go to the next handler. A row or tombstone is answered once the box has carried
// it out (box.Box.ApplyRow, ApplyTombstone): an error status says it failed, and the
// sending box logs it and retries.
type MeshAPI struct {
	// MaxRowBytes bounds a replicated row's body. Default 256 KiB.
	MaxRowBytes int64 `json:"max_row_bytes,omitempty"`

	app  *App
	done <-chan struct{} // closed when this config is unloaded
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
	appIface, err := ctx.App("lchat")
	if err != nil {
		return fmt.Errorf("getting lchat app: %v", err)
	}
	h.app = appIface.(*App)
	h.done = ctx.Done()
	if h.MaxRowBytes <= 0 {
		h.MaxRowBytes = mesh.DefaultMaxRowBytes
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *MeshAPI) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	p := r.URL.Path
	if p != mesh.PathRoutes && p != mesh.PathStatus && !strings.HasPrefix(p, mesh.PathRoute) && !strings.HasPrefix(p, mesh.PathConns) &&
		!strings.HasPrefix(p, standby.PathPrefix) && !strings.HasPrefix(p, standby.PathRelease) && p != mesh.PathWatch {
		return next.ServeHTTP(w, r)
	}
	b := h.app.box
	ms := b.Mesh()
	if ms == nil {
		return caddyhttp.Error(http.StatusNotFound, box.ErrMeshOff)
	}
	if cfg := ms.Config(); !mesh.Authorize(r, cfg.Token, cfg.Accept...) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lchat mesh"`)
		return caddyhttp.Error(http.StatusUnauthorized, errors.New("mesh token missing or wrong"))
	}
	switch {
	case p == mesh.PathWatch && r.Method == http.MethodGet:
		// Held open by the boxes that stand by for this one's spaces (box/standbywatch.go);
		// ended by a reload, which unloads this handler.
		return b.ServeWatch(w, r, h.done)
	case strings.HasPrefix(p, standby.PathPrefix):
		// The streams of the spaces this box stands by for (engine/standby.go); the
		// watcher looks for a new holder to watch at once (over a kept stream, at its
		// first segment: the box's spool.Started).
		defer b.KickStandbyWatch()
		return b.Standby().ServePeer(w, r)
	case strings.HasPrefix(p, standby.PathRelease):
		// A box that stands by for one of this box's spaces is leaving the fleet.
		standby.ServeRelease(w, r, b.Engine().ReleaseStandby)
		return nil
	case strings.HasPrefix(p, mesh.PathConns):
		cs := h.app.conns
		if cs == nil {
			return caddyhttp.Error(http.StatusNotFound, errors.New("this box holds no connections"))
		}
		if err := cs.ServePeer(w, r); err != nil {
			return caddyhttp.Error(box.StatusOf(err), err)
		}
		return nil
	case p == mesh.PathRoutes && r.Method == http.MethodGet:
		rows, err := ms.Node().InScopeRows(b.Registry())
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		return mesh.WriteRoutes(w, rows)
	case p == mesh.PathStatus && r.Method == http.MethodGet:
		return writeJSON(w, http.StatusOK, b.MeshStatus())
	case strings.HasPrefix(p, mesh.PathRoute) && r.Method == http.MethodPut:
		return h.putRoute(w, r)
	case strings.HasPrefix(p, mesh.PathRoute) && r.Method == http.MethodDelete:
		return h.deleteRoute(w, r)
	}
	return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s %s", r.Method, p))
}

func (h *MeshAPI) putRoute(w http.ResponseWriter, r *http.Request) error {
	row, err := mesh.DecodeRow(r, h.MaxRowBytes)
	if err != nil {
		h.app.box.Mesh().C.RowsRejected.Add(1)
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	res, err := h.app.box.ApplyRow(r.Context(), row)
	switch {
	case err != nil:
		return caddyhttp.Error(box.StatusOf(err), err)
	case res.Kept:
		return writeJSON(w, http.StatusOK, map[string]string{"kept": row.Host})
	case res.Stale:
		return writeJSON(w, http.StatusOK, map[string]string{"stale": row.Host})
	}
	return writeJSON(w, http.StatusOK, res.Route.Summary())
}

func (h *MeshAPI) deleteRoute(w http.ResponseWriter, r *http.Request) error {
	host, ok := mesh.HostFromPath(r.URL.Path)
	if !ok {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("no valid host in the path"))
	}
	res, err := h.app.box.ApplyTombstone(r.Context(), host, r.Header.Get(mesh.RevHeader))
	switch {
	case err != nil:
		return caddyhttp.Error(box.StatusOf(err), err)
	case res.Stale:
		return writeJSON(w, http.StatusOK, map[string]any{"stale": host})
	}
	return writeJSON(w, http.StatusOK, map[string]any{"removed": host, "existed": res.Existed})
}

// Interface guards
var (
	_ caddy.Provisioner           = (*MeshAPI)(nil)
	_ caddyhttp.MiddlewareHandler = (*MeshAPI)(nil)
)
