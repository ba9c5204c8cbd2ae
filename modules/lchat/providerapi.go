package lchat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/spacestore"
)

func init() {
	caddy.RegisterModule(ProviderAPI{})
}

// ProviderAPI serves the provider API (docs/providers.md, provider/wire.go) to the fleets
// this fleet hosts for (the lchat app's provider_clients): under /api/provider/v1/, each
// call authenticated by the client's bearer token and scoped to the spaces hosted for it
// (provider.API). Other paths go to the next handler. Errors are JSON {"error": ...}.
type ProviderAPI struct {
	app    *App
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (ProviderAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.lchat_provider_api",
		New: func() caddy.Module { return new(ProviderAPI) },
	}
}

// Provision finds the lchat app.
func (h *ProviderAPI) Provision(ctx caddy.Context) error {
	appIface, err := ctx.App("lchat")
	if err != nil {
		return fmt.Errorf("getting lchat app: %v", err)
	}
	h.app = appIface.(*App)
	h.logger = ctx.Logger()
	return nil
}

// maxCreateBody bounds a PUT of a space (its env included).
const maxCreateBody = 256 << 10

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *ProviderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !strings.HasPrefix(r.URL.Path, "/api/provider/") {
		return next.ServeHTTP(w, r)
	}
	ps := h.app.prov
	c := ps.clientsOrNil().Authenticate(r)
	if c == nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lchat provider"`)
		return writeAPIError(w, http.StatusUnauthorized, errors.New("provider token missing or wrong"))
	}
	host, op, ok := provider.SplitPath(r.URL.Path)
	if !ok {
		return writeAPIError(w, http.StatusNotFound, errors.New("no such operation of the provider API"))
	}
	side, err := h.app.box.ProviderSide()
	if err != nil {
		return writeAPIError(w, box.StatusOf(err), err)
	}
	api := &provider.API{F: side, Limits: ps.clientLimits[c.Name]}
	ctx := r.Context()
	switch {
	case op == provider.OpSpace && r.Method == http.MethodGet:
		st, err := api.Status(ctx, c, host)
		return h.answer(w, http.StatusOK, st, err)
	case op == provider.OpSpace && r.Method == http.MethodPut:
		var req provider.CreateRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, maxCreateBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return writeAPIError(w, http.StatusBadRequest, errors.New("the body must be a JSON space: kind, version, env"))
		}
		st, created, err := api.Host(ctx, c, host, req)
		status := http.StatusOK
		if created {
			status = http.StatusCreated
			h.logger.Info("hosting a space for a client fleet", zap.String("host", host), zap.String("client", c.Name))
		}
		return h.answer(w, status, st, err)
	case op == provider.OpSpace && r.Method == http.MethodDelete:
		err := api.Delete(ctx, c, host)
		if err == nil {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
		return h.answer(w, 0, nil, err)
	case op == provider.OpState && r.Method == http.MethodPut:
		imp, err := api.Import(ctx, c, host, r.Body)
		return h.answer(w, http.StatusOK, imp, err)
	case op == provider.OpHibernate && r.Method == http.MethodPost:
		st, err := api.Hibernate(ctx, c, host)
		return h.answer(w, http.StatusOK, st, err)
	case op == provider.OpResume && r.Method == http.MethodPost:
		st, err := api.Resume(ctx, c, host)
		return h.answer(w, http.StatusOK, st, err)
	case op == provider.OpExport && r.Method == http.MethodGet:
		begun := false
		err := api.Export(ctx, c, host, func() io.Writer {
			begun = true
			w.Header().Set("Content-Type", provider.ExportContentType)
			w.WriteHeader(http.StatusOK)
			return w
		})
		if begun {
			// The status is sent: a failure now cuts the stream, and the reader, missing
			// its signed end, keeps nothing.
			if err != nil {
				h.logger.Warn("export cut", zap.String("host", host), zap.String("client", c.Name), zap.Error(err))
				panic(http.ErrAbortHandler)
			}
			return nil
		}
		return h.answer(w, 0, nil, err)
	}
	return writeAPIError(w, http.StatusMethodNotAllowed, errors.New("method not allowed"))
}

// answer writes v with status, or the error's status: what a client is told names only
// its own spaces (ErrNotYours is a 404 whoever holds the host).
func (h *ProviderAPI) answer(w http.ResponseWriter, status int, v any, err error) error {
	if err == nil {
		return writeJSON(w, status, v)
	}
	switch {
	case errors.Is(err, provider.ErrNotYours):
		return writeAPIError(w, http.StatusNotFound, provider.ErrNotYours)
	case errors.Is(err, provider.ErrNotCovered):
		return writeAPIError(w, http.StatusForbidden, err)
	case errors.Is(err, provider.ErrCap), errors.Is(err, provider.ErrNotHeld), errors.Is(err, spacestore.ErrSpaceAwake):
		return writeAPIError(w, http.StatusConflict, err)
	case errors.Is(err, provider.ErrBadExport):
		return writeAPIError(w, http.StatusBadRequest, err)
	}
	status = box.StatusOf(err)
	if status == http.StatusInternalServerError {
		h.logger.Error("provider API", zap.Error(err))
	}
	return writeAPIError(w, status, err)
}

func writeAPIError(w http.ResponseWriter, status int, err error) error {
	return writeJSON(w, status, map[string]string{"error": err.Error()})
}

// clientsOrNil is the clients of a config (none without a set).
func (ps *providerSet) clientsOrNil() provider.Clients {
	if ps == nil {
		return nil
	}
	return ps.clients
}

// Interface guards
var (
	_ caddy.Provisioner           = (*ProviderAPI)(nil)
	_ caddyhttp.MiddlewareHandler = (*ProviderAPI)(nil)
)
