package lchat

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddy.RegisterModule(providerAdmin{})
}

// providerAdmin is the admin.api.lchat_providers module: the provider seam's operator
// endpoints, GET /lchat/providers (providers, their health and delegated spaces; client
// fleets and their hosted spaces), POST /lchat/providers/delegate/{host} {"to": name}
// and POST /lchat/providers/reclaim/{host} (provider.Delegate, provider.Reclaim).
type providerAdmin struct{ appRef }

// CaddyModule returns the Caddy module information.
func (providerAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lchat_providers",
		New: func() caddy.Module { return new(providerAdmin) },
	}
}

// Routes returns the admin routes.
func (a *providerAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/lchat/providers", Handler: caddy.AdminHandlerFunc(a.list)},
		{Pattern: "/lchat/providers/", Handler: caddy.AdminHandlerFunc(a.move)},
	}
}

func (a *providerAdmin) list(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	if err := a.configured(); err != nil {
		return err
	}
	st := a.app.providerStatus()
	if st == nil {
		st = &adminapi.Providers{Providers: []adminapi.ProviderStatus{}, Clients: []adminapi.ClientStatus{}}
	}
	return writeJSON(w, http.StatusOK, st)
}

// moveTimeout bounds a delegate or reclaim: two sleeps, a copy of the state, the flips.
const moveTimeout = 30 * time.Minute

func (a *providerAdmin) move(w http.ResponseWriter, r *http.Request) error {
	if err := a.configured(); err != nil {
		return err
	}
	rest := strings.TrimPrefix(r.URL.Path, "/lchat/providers/")
	op, host, ok := strings.Cut(rest, "/")
	if !ok || (op != "delegate" && op != "reclaim") {
		return apiErr(http.StatusNotFound, "no such endpoint: POST /lchat/providers/delegate/{host} or /lchat/providers/reclaim/{host}")
	}
	if r.Method != http.MethodPost {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	if err := registry.ValidateHost(host); err != nil {
		return apiErr(http.StatusBadRequest, "%v", err)
	}
	b := a.app.box
	// An unknown host is "no route" whatever the box's config, as for every other command.
	rt, err := b.Registry().Get(host)
	if errors.Is(err, registry.ErrNotFound) {
		return apiErr(http.StatusNotFound, "no route for host %s", host)
	}
	if err != nil {
		return boxErr(err)
	}
	side, err := b.ProviderSide()
	if err != nil {
		return boxErr(err)
	}
	name := ""
	if op == "delegate" {
		var req adminapi.DelegateRequest
		if err := decodeStrict(r, &req); err != nil {
			return err
		}
		if req.To == "" {
			return apiErr(http.StatusBadRequest, `body must set "to": the provider`)
		}
		name = req.To
	} else {
		if rt.Provider == "" {
			return writeJSON(w, http.StatusOK, provider.Moved{Host: host, Already: true})
		}
		name = rt.Provider
	}
	c := a.app.prov.conn(name)
	if c == nil {
		return apiErr(http.StatusBadRequest, "no provider %q is configured on this box", name)
	}
	// Carried to its end (or its undo) even if the operator's client goes away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), moveTimeout)
	defer cancel()
	var res provider.Moved
	if op == "delegate" {
		res, err = provider.Delegate(ctx, side, c, host)
	} else {
		res, err = provider.Reclaim(ctx, side, c, host, a.app.prov.limits[name])
	}
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, provider.ErrMoveInvalid):
			status = http.StatusBadRequest
		case errors.Is(err, provider.ErrMoveNotFound):
			status = http.StatusNotFound
		case errors.Is(err, provider.ErrMoveRefused):
			status = http.StatusConflict
		case errors.Is(err, provider.ErrMoveUpstream):
			status = http.StatusBadGateway
		default:
			status = box.StatusOf(err)
		}
		a.app.logger.Warn(op+" failed", zap.String("host", host), zap.String("provider", name), zap.Error(err))
		return apiErr(status, "%v", err)
	}
	a.app.logger.Info(op+" done", zap.String("host", host), zap.String("provider", name), zap.Bool("already", res.Already),
		zap.Int64("generation", res.Generation), zap.Int64("bytes", res.Bytes))
	return writeJSON(w, http.StatusOK, res)
}

// statusWithProviders is GET /lchat/status with the seam's providers and client fleets,
// when the config has any.
type statusWithProviders struct {
	adminapi.Status
	Providers *adminapi.Providers `json:"providers,omitempty"`
}

// ProviderStatus is the seam as this box sees it, the document of GET /lchat/providers;
// nil when the config has no providers and no clients. The console shows it
// (console.ProviderSource).
func (a *App) ProviderStatus() *adminapi.Providers { return a.providerStatus() }

// providerStatus is the seam as this box sees it; nil when the config has no providers
// and no clients.
func (a *App) providerStatus() *adminapi.Providers {
	ps := a.prov
	if ps == nil || len(ps.conns) == 0 && len(ps.clients) == 0 {
		return nil
	}
	out := &adminapi.Providers{Providers: []adminapi.ProviderStatus{}, Clients: []adminapi.ClientStatus{}}
	byProvider := map[string][]adminapi.DelegatedSpace{}
	byClient := map[string][]string{}
	for after := ""; ; {
		page, next, err := a.box.Registry().List(after, registry.MaxPageLimit)
		if err != nil {
			break
		}
		for _, rt := range page {
			if rt.Provider != "" {
				state := rt.ProviderState
				if state == "" {
					state = "serving"
				}
				byProvider[rt.Provider] = append(byProvider[rt.Provider], adminapi.DelegatedSpace{Host: rt.Host, State: state})
			}
			if rt.HostedFor != "" {
				byClient[rt.HostedFor] = append(byClient[rt.HostedFor], rt.Host)
			}
		}
		if after = next; next == "" {
			break
		}
	}
	for name, c := range ps.conns {
		h := c.Health()
		spaces := byProvider[name]
		if spaces == nil {
			spaces = []adminapi.DelegatedSpace{}
		}
		out.Providers = append(out.Providers, adminapi.ProviderStatus{Name: name, URL: c.P.URL, Domains: c.P.Domains,
			MaxSpaces: c.P.MaxSpaces, Health: h.Health, Healthy: h.Healthy, Requests: h.Requests, Errors: h.Errors, LastError: h.LastError, Spaces: spaces})
	}
	slices.SortFunc(out.Providers, func(x, y adminapi.ProviderStatus) int { return strings.Compare(x.Name, y.Name) })
	for _, c := range ps.clients {
		spaces := byClient[c.Name]
		if spaces == nil {
			spaces = []string{}
		}
		out.Clients = append(out.Clients, adminapi.ClientStatus{Name: c.Name, Domains: c.Domains, MaxSpaces: c.MaxSpaces, Spaces: spaces})
	}
	return out
}

// Interface guards
var (
	_ caddy.AdminRouter = (*providerAdmin)(nil)
	_ caddy.Provisioner = (*providerAdmin)(nil)
)
