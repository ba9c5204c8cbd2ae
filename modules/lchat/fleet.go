package lchat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"

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
type SeedEvent struct {
	Event string `json:"event"` // plan, put, tombstone, error, done
	Host  string `json:"host,omitempty"`
	Error string `json:"error,omitempty"`
	N     int    `json:"n,omitempty"`
	Of    int    `json:"of,omitempty"`
	Puts  int    `json:"puts,omitempty"`
	Tombs int    `json:"tombstones,omitempty"`
	Fails int    `json:"failures,omitempty"`
}

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
	local, err := a.app.allRows()
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
	emit(SeedEvent{Event: "plan", Puts: len(puts), Tombs: len(tombs), Of: len(remote)})
	fails := 0
	for i, row := range puts {
		ev := SeedEvent{Event: "put", Host: row.Host, N: i + 1, Of: len(puts)}
		if err := client.PutRoute(ctx, peer, row); err != nil {
			fails++
			ev.Event, ev.Error = "error", err.Error()
		}
		emit(ev)
	}
	for i, host := range tombs {
		ev := SeedEvent{Event: "tombstone", Host: host, N: i + 1, Of: len(tombs)}
		if err := client.DeleteRoute(ctx, peer, host); err != nil {
			fails++
			ev.Event, ev.Error = "error", err.Error()
		}
		emit(ev)
	}
	emit(SeedEvent{Event: "done", Puts: len(puts), Tombs: len(tombs), Fails: fails})
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
type RelocateResult struct {
	Host   string   `json:"host"`
	From   string   `json:"from"`
	To     string   `json:"to"`
	Store  string   `json:"store"`
	Fanout []string `json:"fanout"`
	// Copy is set when the space was copied to the destination region's bucket.
	Copy    *CopyResult `json:"copy,omitempty"`
	DNS     string      `json:"dns,omitempty"`
	Already bool        `json:"already,omitempty"`
}

// relocate moves a hibernating space to another region. Everything that can refuse
// (validation, an awake space, a destination bucket that is unknown, --move-dns
// without a provider or a live destination box) refuses before anything changes; then
// the store copy (per-region buckets only), the home_region flip with its re-fan-out,
// and the DNS record, in that order, so a re-run after a failure finishes the job.
func (a *meshAdmin) relocate(w http.ResponseWriter, r *http.Request, ms *meshState, host string) error {
	if err := registry.ValidateHost(host); err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	var req relocateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	if req.To == "" {
		return apiErr(http.StatusBadRequest, `body must set "to": the destination region`)
	}
	if err := registry.ValidateRegion(req.To); err != nil {
		return apiErr(http.StatusBadRequest, "to: %v", err)
	}
	cur, err := a.app.shared.reg.Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return apiErr(http.StatusNotFound, "no route for host %s", host)
	}
	if !cur.Hibernate {
		return apiErr(http.StatusConflict, "%s is a live route pinned to its box; only hibernating spaces relocate (turn hibernation on first)", host)
	}
	for _, s := range a.app.shared.eng.Status() {
		if s.Host == host && (s.State == engine.StateAwake || s.State == engine.StateWaking) {
			return apiErr(http.StatusConflict, "%s is awake on this box; relocate it while it sleeps", host)
		}
	}
	ctx := r.Context()
	own := a.app.shared.bucket
	live := ms.m.Live()

	// The destination's store: this box's bucket, or mesh.region_buckets[to].
	dst, perRegion := a.app.reloc.buckets[req.To]
	if perRegion && sameBucket(dst.String(), own.String()) {
		perRegion = false
	}
	// The destination region's live boxes: in this box's view when they share the
	// bucket, else in the destination bucket's own heartbeats.
	var destBoxes []mesh.Member
	destLive := ms.holderLive
	if perRegion {
		others, err := liveMembersIn(ctx, dst, ms.m.Config().DeadAfter)
		if err != nil {
			return apiErr(http.StatusBadGateway, "destination bucket: %v; nothing was changed", err)
		}
		destLive = func(holder, inc string) bool {
			for _, m := range others {
				if m.Self == holder && m.Incarnation == inc {
					return true
				}
			}
			return false
		}
		live = others
	}
	for _, m := range live {
		if m.Region == req.To && !m.Draining {
			destBoxes = append(destBoxes, m)
		}
	}
	if !perRegion {
		for _, m := range destBoxes {
			if m.Bucket != "" && !sameBucket(m.Bucket, own.String()) {
				return apiErr(http.StatusConflict, "%s boxes keep spaces in bucket %s, not this box's %s: configure mesh.region_buckets for %s to copy the space there; nothing was changed",
					req.To, m.Bucket, own.String(), req.To)
			}
		}
	} else {
		for _, m := range destBoxes {
			if m.Bucket != "" && !sameBucket(m.Bucket, dst.String()) {
				return apiErr(http.StatusConflict, "%s boxes keep spaces in bucket %s, but mesh.region_buckets names %s for %s; nothing was changed",
					req.To, m.Bucket, dst.String(), req.To)
			}
		}
	}

	// --move-dns: the provider and the target address, known before any change.
	var dnsIP netip.Addr
	var dnsBox string
	if req.MoveDNS {
		if a.app.reloc.dns == nil {
			return apiErr(http.StatusConflict, "--move-dns: no DNS provider is configured for relocation on this box (mesh.relocate_dns); nothing was changed")
		}
		candidates := destBoxes
		if owner, ok := mesh.Owner(host, destBoxes, req.To); ok {
			// The box the mesh will place the space on first, then the others.
			candidates = append([]mesh.Member{owner}, destBoxes...)
		}
		for _, m := range candidates {
			if ip, err := netip.ParseAddr(m.Address); err == nil {
				dnsIP, dnsBox = ip, m.Self
				break
			}
		}
		if !dnsIP.IsValid() {
			return apiErr(http.StatusConflict, "--move-dns: no live box of region %s advertises a public address (mesh.public_address); nothing was changed", req.To)
		}
	}

	res := RelocateResult{Host: host, From: cur.HomeRegion, To: req.To,
		Store: "no copy: source and destination share the bucket " + own.String()}
	if perRegion {
		cp, err := copySpace(ctx, own, dst, host, ms.holderLive, destLive)
		if errors.Is(err, ErrSpaceAwake) {
			return apiErr(http.StatusConflict, "%s: %v; home_region was not changed", host, err)
		}
		if err != nil {
			return apiErr(http.StatusBadGateway, "copying %s to %s: %v; home_region was not changed", host, dst.String(), err)
		}
		res.Copy = &cp
		switch {
		case cp.Skipped:
			res.Store = fmt.Sprintf("no copy: %s already holds generation %d (source: %d or older)", dst.String(), cp.DestGeneration, cp.DestGeneration)
		case cp.Generation == 0:
			res.Store = "no copy: the space has no checkpoint in " + own.String()
		default:
			res.Store = fmt.Sprintf("copied generation %d from %s to %s: %d blobs, %d bytes (lease not copied)",
				cp.Generation, own.String(), dst.String(), cp.Blobs, cp.Bytes)
		}
	}
	stored := cur
	if cur.HomeRegion == req.To {
		res.Already = true
	} else {
		stored, err = a.app.shared.reg.Update(host, func(rt *registry.Route) error {
			rt.HomeRegion = req.To
			return nil
		})
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
	}
	// Re-fan-out to the union of old and new targets: the old region's boxes learn the
	// new placement, the new region's boxes get the row.
	seen := map[string]bool{}
	var targets []mesh.Member
	meshLive := ms.m.Live()
	if perRegion {
		meshLive = append(meshLive, live...)
	}
	for _, t := range append(mesh.Targets(host, cur.HomeRegion, meshLive, ms.cfg.Self), mesh.Targets(host, req.To, meshLive, ms.cfg.Self)...) {
		if !seen[t.Self] {
			seen[t.Self] = true
			targets = append(targets, t)
			res.Fanout = append(res.Fanout, t.Self)
		}
	}
	sort.Strings(res.Fanout)
	if len(targets) > 0 {
		ms.count(ms.client.Fanout(ms.ctx, ms.rowFromRoute(&stored), targets))
	}
	if req.MoveDNS {
		done, err := a.app.reloc.dns.setARecord(ctx, host, dnsIP)
		if err != nil {
			a.logger.Error("relocate: DNS update failed", zap.String("host", host), zap.Error(err))
			return apiErr(http.StatusBadGateway, "relocated %s to %s (store and home_region done), but the DNS record was not changed: %v; re-run with --move-dns", host, req.To, err)
		}
		res.DNS = done + " (" + dnsBox + ")"
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
