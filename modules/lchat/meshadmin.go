package lchat

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/mesh"
)

func init() {
	caddy.RegisterModule(meshAdmin{})
}

// meshAdmin is the admin.api.lchat_mesh module: the mesh's operator endpoints on Caddy's
// admin API, GET /lchat/fleet (every live box's status), POST /lchat/mesh/seed
// (mesh-seed, with progress streamed as JSON lines) and POST /lchat/mesh/relocate/{host}.
type meshAdmin struct{ appRef }

// CaddyModule returns the Caddy module information.
func (meshAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat_mesh",
		New: func() caddy.Module { return new(meshAdmin) },
	}
}

// Routes returns the admin routes.
func (a *meshAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/lchat/fleet", Handler: caddy.AdminHandlerFunc(a.fleet)},
		{Pattern: "/lchat/mesh/", Handler: caddy.AdminHandlerFunc(a.serveMesh)},
	}
}

// box is the lchat app's box when the mesh is on.
func (a *meshAdmin) box() (*box.Box, error) {
	if err := a.configured(); err != nil {
		return nil, err
	}
	if a.app.box.Mesh() == nil {
		return nil, apiErr(http.StatusConflict, "%v", box.ErrMeshOff)
	}
	return a.app.box, nil
}

func (a *meshAdmin) fleet(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	b, err := a.box()
	if err != nil {
		return err
	}
	f := b.Fleet(r.Context())
	out := adminapi.Fleet{Self: f.Self, Members: make([]adminapi.FleetMember, len(f.Boxes))}
	for i, m := range f.Boxes {
		out.Members[i] = adminapi.FleetMember{Box: m, HeartbeatAge: m.HeartbeatAge.Round(time.Millisecond).String()}
	}
	c := b.Capacity()
	out.Capacity = &adminapi.FleetCapacity{Boxes: c.Fleet.Boxes, WarmSet: c.Fleet.WarmSet, BoxBudget: c.Fleet.BoxBudget,
		DesiredBoxes: c.Fleet.Desired, Headroom: c.Autoscale.Headroom, Hysteresis: c.Autoscale.Hysteresis,
		BoxWarmSet: c.WarmSet, BoxBudgetOwn: c.Budget}
	return writeJSON(w, http.StatusOK, out)
}

func (a *meshAdmin) serveMesh(w http.ResponseWriter, r *http.Request) error {
	if err := a.configured(); err != nil {
		return err
	}
	path := strings.TrimPrefix(r.URL.Path, "/lchat/mesh/")
	switch {
	case path == "seed" && r.Method == http.MethodPost:
		b, err := a.box()
		if err != nil {
			return err
		}
		return a.seed(w, r, b)
	case strings.HasPrefix(path, "relocate/") && r.Method == http.MethodPost:
		// Relocate refuses a box without the mesh itself, after an unknown host's "no route".
		return a.relocate(w, r, a.app.box, strings.TrimPrefix(path, "relocate/"))
	}
	return apiErr(http.StatusNotFound, "resource not found: %s %s", r.Method, r.URL.Path)
}

func (a *meshAdmin) seed(w http.ResponseWriter, r *http.Request, b *box.Box) error {
	var req adminapi.SeedRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	plan, err := b.PlanSeed(r.Context(), box.SeedRequest{Peer: req.Peer, Region: req.Region, Prune: req.Prune,
		Domains: req.Domains, Token: mesh.Secret(req.Token)})
	if err != nil {
		return boxErr(err)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	plan.Run(r.Context(), func(ev adminapi.SeedEvent) {
		enc.Encode(ev)
		if flusher != nil {
			flusher.Flush()
		}
	})
	return nil
}

// relocate moves a hibernating space to another region (box.Box.Relocate).
func (a *meshAdmin) relocate(w http.ResponseWriter, r *http.Request, b *box.Box, host string) error {
	var req adminapi.RelocateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	res, err := b.Relocate(r.Context(), mesh.RelocateRequest{Host: host, To: req.To, MoveDNS: req.MoveDNS})
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, res)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*meshAdmin)(nil)
	_ caddy.Provisioner = (*meshAdmin)(nil)
)
