// Package console is the Caddy glue of the operator's console: the
// `http.handlers.lchat_console` handler, a read-only view of the fleet, its spaces, live
// events and charts, mounted on any site behind Caddy's own authentication. It reads the
// lchat app through fleetview.Source; the history its charts draw is a fleetview.Recorder
// that outlives config reloads.
package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the `http.handlers.lchat_console` handler. It answers every request it sees
// (mount it on its own site or path, e.g. `handle_path /console/*`), behind whatever
// authentication the site puts before it (basic_auth, forward_auth): the console shows
// hostnames, boxes and their counters, never env values or tokens.
type Handler struct {
	// Actions switches on the write actions (hibernate on/off, relocate, remove), each
	// behind a confirmation page. Default false: the console is read-only.
	Actions bool `json:"actions,omitempty"`
	// SampleInterval is how often the charts sample the box. Default 30s.
	SampleInterval caddy.Duration `json:"sample_interval,omitempty"`
	// PageSize is how many spaces a page lists. Default 100.
	PageSize int `json:"page_size,omitempty"`

	src     fleetview.Source
	actions fleetview.Actions // nil unless Actions and the source offers them
	prov    ProviderSource    // the provider seam; nil when the app offers none
	stby    StandbySource     // the warm standbys; nil when the source offers none
	rec     *recorder
	syncs   *syncCache // manifests read for a last sync the box does not know (lastsync.go)
	poolKey any
	logger  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.lchat_console",
		New: func() caddy.Module { return new(Handler) },
	}
}

// SourceProvider is what the lchat app offers the console. FleetView returns a value that
// stays equal across config reloads as long as the app's state does, so the console's
// history survives a reload.
type SourceProvider interface {
	FleetView() fleetview.Source
}

// recorder is the pool's value: one Recorder and its sampling goroutine per source.
type recorder struct {
	*fleetview.Recorder
	derp   derpHolder
	cancel context.CancelFunc
	done   chan struct{}
}

// Destruct stops the sampling goroutine.
func (r *recorder) Destruct() error {
	r.cancel()
	<-r.done
	return nil
}

var pool = caddy.NewUsagePool()

// Provision finds the lchat app (and the derp_switch app when configured) and joins the
// recorder of its source.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.SampleInterval == 0 {
		h.SampleInterval = caddy.Duration(30 * time.Second)
	}
	if h.PageSize == 0 {
		h.PageSize = 100
	}
	appIface, err := ctx.AppIfConfigured("lchat")
	if err != nil {
		return fmt.Errorf("lchat_console needs the lchat app: %v", err)
	}
	sp, ok := appIface.(SourceProvider)
	if !ok {
		return fmt.Errorf("lchat_console: the lchat app (%T) offers no fleet view", appIface)
	}
	h.src = sp.FleetView()
	h.prov, _ = appIface.(ProviderSource)
	h.stby, _ = h.src.(StandbySource)
	h.syncs = new(syncCache)
	if h.Actions {
		if a, ok := h.src.(fleetview.Actions); ok {
			h.actions = a
		} else {
			return errors.New("lchat_console: actions are on but the lchat app offers none")
		}
	}
	derp := derpSource(ctx)
	interval := time.Duration(h.SampleInterval)
	val, _, err := pool.LoadOrNew(h.src, func() (caddy.Destructor, error) {
		r := &recorder{done: make(chan struct{})}
		r.Recorder = fleetview.NewRecorder(h.src, &r.derp)
		var rctx context.Context
		rctx, r.cancel = context.WithCancel(context.Background())
		logger := h.logger
		go func() {
			defer close(r.done)
			safego.Run(logger, "console recorder", func() { r.Run(rctx, interval) })
		}()
		return r, nil
	})
	if err != nil {
		return err
	}
	h.rec = val.(*recorder)
	h.rec.derp.set(derp)
	h.poolKey = h.src
	return nil
}

// Validate checks the config.
func (h *Handler) Validate() error {
	if h.SampleInterval < 0 {
		return errors.New("sample_interval: must be positive")
	}
	if h.PageSize < 0 {
		return errors.New("page_size: must be positive")
	}
	return nil
}

// Cleanup lets go of the recorder; the last config using it stops it.
func (h *Handler) Cleanup() error {
	if h.poolKey == nil {
		return nil
	}
	_, err := pool.Delete(h.poolKey)
	h.poolKey = nil
	return err
}

// ServeHTTP serves the console's pages, fragments, JSON, event stream and assets.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	path := strings.TrimPrefix(r.URL.Path, "/")
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !(r.Method == http.MethodPost && strings.HasPrefix(path, "actions/")) {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed", r.Method))
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	switch {
	case path == "":
		if dir, ok := mountedWithoutSlash(r); ok {
			// Relative links need the console's root to end in a slash.
			w.Header().Set("Location", dir+"/")
			w.WriteHeader(http.StatusMovedPermanently)
			return nil
		}
		return h.serveIndex(w, r)
	case path == "box":
		return h.serveBox(w, r)
	case strings.HasPrefix(path, "space/"):
		return h.serveSpace(w, r, strings.TrimPrefix(path, "space/"))
	case strings.HasPrefix(path, "fragment/"):
		return h.serveFragment(w, r, strings.TrimPrefix(path, "fragment/"))
	case path == "events":
		return h.serveEvents(w, r)
	case strings.HasPrefix(path, "api/"):
		return h.serveAPI(w, r, strings.TrimPrefix(path, "api/"))
	case strings.HasPrefix(path, "actions/"):
		return h.serveAction(w, r, strings.TrimPrefix(path, "actions/"))
	case strings.HasPrefix(path, "static/"):
		return serveStatic(w, r, strings.TrimPrefix(path, "static/"))
	}
	return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no console page %q", r.URL.Path))
}

// mountedWithoutSlash reports whether the site mounted the console under a path and the
// request named that path without its trailing slash (/console rather than /console/),
// and returns the path's last element for a relative redirect.
func mountedWithoutSlash(r *http.Request) (string, bool) {
	orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if !ok || orig.URL == nil {
		return "", false
	}
	p := orig.URL.Path
	if p == "" || p == "/" || strings.HasSuffix(p, "/") {
		return "", false
	}
	return p[strings.LastIndex(p, "/")+1:], true
}

// derpHolder is the recorder's DERPSource: the newest config's derp_switch app, or none.
type derpHolder struct {
	mu  sync.Mutex
	src fleetview.DERPSource
}

func (d *derpHolder) set(src fleetview.DERPSource) {
	d.mu.Lock()
	d.src = src
	d.mu.Unlock()
}

// DERP reads the current derp_switch app.
func (d *derpHolder) DERP() (fleetview.DERP, bool) {
	d.mu.Lock()
	src := d.src
	d.mu.Unlock()
	if src == nil {
		return fleetview.DERP{}, false
	}
	return src.DERP()
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Destructor            = (*recorder)(nil)
	_ fleetview.DERPSource        = (*derpHolder)(nil)
)
