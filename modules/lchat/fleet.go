package lchat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"

	"github.com/lchat/lchat-caddy/internal/safego"
)

func init() {
	caddy.RegisterModule(meshAdmin{})
}

// meshAdmin serves the mesh's operator endpoints on Caddy's admin API:
// GET /lchat/fleet (every live box's status), POST /lchat/mesh/seed (mesh-seed, with
// progress streamed as JSON lines) and POST /lchat/mesh/relocate/{host}.
type meshAdmin struct {
	app    *App
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (meshAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat_mesh",
		New: func() caddy.Module { return new(meshAdmin) },
	}
}

// Provision finds the lchat app if the config has one.
func (a *meshAdmin) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a)
	if app, err := ctx.AppIfConfigured("lchat"); err == nil {
		a.app = app.(*App)
	}
	return nil
}

// Routes returns the admin routes.
func (a *meshAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/lchat/fleet", Handler: caddy.AdminHandlerFunc(a.fleet)},
		{Pattern: "/lchat/mesh/", Handler: caddy.AdminHandlerFunc(a.serveMesh)},
	}
}

func (a *meshAdmin) mesh() (*meshState, error) {
	if a.app == nil || a.app.shared == nil {
		return nil, apiErr(http.StatusNotFound, "the lchat app is not configured")
	}
	if a.app.shared.mesh == nil {
		return nil, apiErr(http.StatusConflict, "%v", errMeshOff)
	}
	return a.app.shared.mesh, nil
}

// FleetMember is one box in GET /lchat/fleet.
type FleetMember struct {
	Self         string            `json:"self"`
	Region       string            `json:"region,omitempty"`
	HeartbeatAge string            `json:"heartbeat_age"`
	Version      string            `json:"version,omitempty"`
	Fenced       bool              `json:"fenced"`
	Awake        []string          `json:"awake"`
	Counters     map[string]uint64 `json:"counters,omitempty"`
	Error        string            `json:"error,omitempty"`
}

// Fleet is GET /lchat/fleet.
type Fleet struct {
	Self    string        `json:"self"`
	Members []FleetMember `json:"members"`
}

func (a *meshAdmin) fleet(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	ms, err := a.mesh()
	if err != nil {
		return err
	}
	live := ms.m.Live()
	out := Fleet{Self: ms.cfg.Self, Members: make([]FleetMember, len(live))}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, m := range live {
		fm := &out.Members[i]
		fm.Self, fm.Region, fm.Version = m.Self, m.Region, m.Version
		fm.HeartbeatAge = m.Age.Round(time.Millisecond).String()
		if m.Self == ms.cfg.Self {
			st := a.app.meshStatus()
			fm.Fenced, fm.Awake, fm.Counters = st.Fenced, st.Awake, st.Counters
			continue
		}
		safego.Go(&wg, a.logger.With(zap.String("peer", m.Self)), "fleet status read", func() {
			fm.Error = "reading status: internal error" // until it is read
			raw, err := ms.client.Status(ctx, m.Self)
			if err != nil {
				fm.Error = err.Error()
				return
			}
			var st MeshStatus
			if err := json.Unmarshal(raw, &st); err != nil {
				fm.Error = fmt.Sprintf("decoding status: %v", err)
				return
			}
			fm.Fenced, fm.Awake, fm.Counters, fm.Error = st.Fenced, st.Awake, st.Counters, ""
		})
	}
	wg.Wait()
	return writeJSON(w, http.StatusOK, out)
}

func (a *meshAdmin) serveMesh(w http.ResponseWriter, r *http.Request) error {
	ms, err := a.mesh()
	if err != nil {
		return err
	}
	path := strings.TrimPrefix(r.URL.Path, "/lchat/mesh/")
	switch {
	case path == "seed" && r.Method == http.MethodPost:
		return a.seed(w, r, ms)
	case strings.HasPrefix(path, "relocate/") && r.Method == http.MethodPost:
		return a.relocate(w, r, ms, strings.TrimPrefix(path, "relocate/"))
	}
	return apiErr(http.StatusNotFound, "resource not found: %s %s", r.Method, r.URL.Path)
}

// seedRequest is the POST /lchat/mesh/seed body.
type seedRequest struct {
	Peer   string `json:"peer"`
	Region string `json:"region,omitempty"`
	Prune  bool   `json:"prune,omitempty"`
	// Domains override this box's mesh domains as the seed's scope (from --env-file).
	Domains []string `json:"domains,omitempty"`
	// Token overrides this box's mesh token for the peer (from --env-file). Never echoed.
	Token string `json:"token,omitempty"`
}

// SeedEvent is one line of mesh-seed progress.
type SeedEvent = mesh.SeedEvent

func (a *meshAdmin) seed(w http.ResponseWriter, r *http.Request, ms *meshState) error {
	var req seedRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	peer, err := mesh.ParseSelf(req.Peer)
	if err != nil {
		return apiErr(http.StatusBadRequest, "peer: %v", err)
	}
	domains := ms.cfg.Domains
	if len(req.Domains) > 0 {
		domains = req.Domains
	}
	client := *ms.client
	if req.Token != "" {
		client.Token = mesh.Secret(req.Token)
	}
	ctx := r.Context()
	local, err := ms.box.Rows(a.app.shared.reg)
	if err != nil {
		// A partial registry must never reach the planner: --prune would tombstone
		// every peer row the read missed.
		return apiErr(http.StatusInternalServerError, "reading this box's routes; nothing was sent: %v", err)
	}
	remote, err := client.ListRoutes(ctx, peer)
	if err != nil {
		return apiErr(http.StatusBadGateway, "listing the peer's routes: %v", err)
	}
	puts, tombs, err := mesh.Plan(local, remote, mesh.PlanOptions{Domains: domains, Region: req.Region, Prune: req.Prune})
	if errors.Is(err, mesh.ErrEmptySource) {
		return apiErr(http.StatusConflict, "%v", err)
	}
	if err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	emit := func(ev SeedEvent) {
		enc.Encode(ev)
		if flusher != nil {
			flusher.Flush()
		}
	}
	fails := mesh.RunSeed(ctx, &client, peer, puts, tombs, len(remote), emit)
	a.logger.Info("mesh-seed done", zap.String("peer", peer), zap.Int("puts", len(puts)),
		zap.Int("tombstones", len(tombs)), zap.Int("failures", fails))
	return nil
}

// relocateRequest is the POST /lchat/mesh/relocate/{host} body.
type relocateRequest struct {
	To      string `json:"to"`
	MoveDNS bool   `json:"move_dns,omitempty"`
}

// RelocateResult is the answer of a relocation.
type RelocateResult = mesh.RelocateResult

// relocate moves a hibernating space to another region (mesh.Relocator).
func (a *meshAdmin) relocate(w http.ResponseWriter, r *http.Request, ms *meshState, host string) error {
	var req relocateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	res, err := a.app.relocator(ms).Relocate(r.Context(), mesh.RelocateRequest{Host: host, To: req.To, MoveDNS: req.MoveDNS})
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, mesh.ErrRelocateInvalid):
			status = http.StatusBadRequest
		case errors.Is(err, mesh.ErrRelocateNotFound):
			status = http.StatusNotFound
		case errors.Is(err, mesh.ErrRelocateRefused):
			status = http.StatusConflict
		case errors.Is(err, mesh.ErrRelocateUpstream):
			status = http.StatusBadGateway
			a.logger.Error("relocate failed", zap.String("host", host), zap.Error(err))
		}
		return apiErr(status, "%s", mesh.RelocateErrorMessage(err))
	}
	a.logger.Info("space relocated", zap.String("host", host), zap.String("from", res.From), zap.String("to", res.To),
		zap.String("store", res.Store), zap.String("dns", res.DNS))
	return writeJSON(w, http.StatusOK, res)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*meshAdmin)(nil)
	_ caddy.Provisioner = (*meshAdmin)(nil)
)
