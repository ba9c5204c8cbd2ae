package lchat

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/engine"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// upstreamPlaceholder is the replacer value the embedded reverse proxy dials. It is set
// on the request's replacer as a static value, which the replacer finds before it asks
// the HTTP placeholders (a request variable was a slower lookup, on every request).
const upstreamPlaceholder = "lchat.upstream"

// Handler routes a request by its Host through the lchat registry: an unknown host is
// 404; a live route is proxied to its upstream; a hibernating route is woken if asleep
// and proxied to its instance's Unix socket. Proxying is Caddy's own reverse proxy, so
// streaming, WebSockets and trailers behave as in `reverse_proxy`. A request (and any
// connection it upgrades to) holds the space awake until it ends.
type Handler struct {
	// FlushInterval is the proxy's flush interval. Default -1: flush at once, so
	// server-sent events and streamed responses are not held back.
	FlushInterval *caddy.Duration `json:"flush_interval,omitempty"`

	// RetryAfter is the Retry-After of a 503 when another box holds the space's
	// lease or the engine gives no better hint. Default 5s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	app       *App
	proxy     *reverseproxy.Handler
	meshProxy *reverseproxy.Handler // forwards to peers; nil without the mesh
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.lchat",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision finds the lchat app and sets up the embedded reverse proxy.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	appIface, err := ctx.App("lchat")
	if err != nil {
		return fmt.Errorf("getting lchat app: %v", err)
	}
	h.app = appIface.(*App)
	if h.RetryAfter == 0 {
		h.RetryAfter = caddy.Duration(5 * time.Second)
	}
	flush := caddy.Duration(-1)
	if h.FlushInterval != nil {
		flush = *h.FlushInterval
	}
	if err := h.provisionProxy(ctx, flush); err != nil {
		return err
	}
	if ms := h.app.box.Mesh(); ms != nil {
		if h.meshProxy, err = newForwardProxy(ctx, ms, flush); err != nil {
			return err
		}
	}
	return nil
}

// provisionProxy sets up the embedded reverse proxy to local upstreams.
func (h *Handler) provisionProxy(ctx caddy.Context, flush caddy.Duration) error {
	h.proxy = &reverseproxy.Handler{
		Upstreams:     reverseproxy.UpstreamPool{{Dial: "{" + upstreamPlaceholder + "}"}},
		FlushInterval: flush,
	}
	if err := h.proxy.Provision(ctx); err != nil {
		return fmt.Errorf("provisioning proxy: %v", err)
	}
	return nil
}

// Cleanup releases the embedded proxy.
func (h *Handler) Cleanup() error {
	if h.meshProxy != nil {
		h.meshProxy.Cleanup()
	}
	if h.proxy != nil {
		return h.proxy.Cleanup()
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	b := h.app.box
	b.Count()
	host := requestHost(r)
	h.meshStrip(r, host)
	rt, ok := b.Lookup(host)
	if !ok {
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no route for host %q", host))
	}
	// Only the box itself sends scheduled wakes; a client cannot pose as one.
	r.Header.Del("X-Lchat-Wake-Reason")
	if done, err := h.place(w, r, rt, next); done {
		return err
	}

	if !rt.Hibernate {
		if rt.Upstream == "" {
			// A lives_at row the mesh did not forward: the mesh is off here, or the
			// row names this very box. Nothing here to dial.
			setRetryAfter(w, time.Duration(h.RetryAfter))
			return caddyhttp.Error(http.StatusServiceUnavailable,
				fmt.Errorf("live route %s runs on another box (%s) and cannot be forwarded from this one", host, rt.LivesAt))
		}
		setUpstream(r, dialAddress(rt.Upstream))
		return h.proxy.ServeHTTP(w, r, next)
	}

	var use *engine.Use
	for wait := time.Duration(0); ; {
		var err error
		if use, err = b.Acquire(r.Context(), rt); err == nil {
			break
		}
		d, ok := b.AcquireFailed(err, rt, requestHops(r))
		if !ok {
			return h.refuse(w, r, host, err)
		}
		if res, ferr := h.forward(w, r, d, next); res == answered {
			return ferr
		}
		// The box holding the lease is live but takes no connections: it is shutting
		// down (and frees each lease as its drain puts the space to sleep), or
		// restarting, or dead (its lease frees with its heartbeat). Try again shortly.
		if wait = leaseWait(r, wait); wait == 0 {
			return h.refuse(w, r, host, err)
		}
	}
	// The reverse proxy returns only when the response, or the connection it
	// upgraded to, is finished: that is when this request stops holding the space.
	defer use.Release()
	h.meshServed(w, r)
	h.setInstanceHeader(w, use)
	setUpstream(r, use.Dial())
	err := h.proxy.ServeHTTP(w, r, next)
	if de := (reverseproxy.DialError{}); errors.As(err, &de) {
		// The engine holds the space awake but its socket takes no connection: end
		// that awake period so the next request wakes a working instance.
		use.Unreachable()
	}
	return h.noAnswer(w, err, "space "+host+": its instance")
}

// noAnswer turns the reverse proxy's error for a request its upstream (an instance, a
// peer: who) never answered (box.NoAnswer) into a 503 with Retry-After. Any other error,
// and a 502 the upstream itself answered (its own response), passes unchanged.
func (h *Handler) noAnswer(w http.ResponseWriter, err error, who string) error {
	var he caddyhttp.HandlerError
	if err == nil || !errors.As(err, &he) || !box.NoAnswer(he.StatusCode) {
		return err
	}
	w.Header().Del(InstanceHeader)
	setRetryAfter(w, time.Duration(h.RetryAfter))
	return caddyhttp.Error(http.StatusServiceUnavailable, fmt.Errorf("%s gave no answer: %w", who, he.Err))
}

// setUpstream tells the embedded reverse proxy where to dial for this request.
func setUpstream(r *http.Request, dial string) {
	r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).Set(upstreamPlaceholder, dial)
}

// refuse answers a request whose space could not be acquired (box.Refuse).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, host string, err error) error {
	ref := box.Refuse(host, err, r.Context().Err() != nil)
	if ref.Status == http.StatusServiceUnavailable {
		after := ref.RetryAfter
		if after <= 0 {
			after = time.Duration(h.RetryAfter)
		}
		setRetryAfter(w, after)
	}
	if ref.Unexpected {
		if c := h.logger.Check(zapcore.ErrorLevel, "waking space"); c != nil {
			c.Write(zap.String("host", host), zap.Error(err))
		}
	}
	return caddyhttp.Error(ref.Status, ref.Err)
}

func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(d, time.Second).Seconds()))))
}

// requestHost is the request's host without port or trailing dot, lowercased.
func requestHost(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(host, ".")
	for i := 0; i < len(host); i++ {
		if c := host[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(host)
		}
	}
	return host
}

// dialAddress turns a live route's upstream into a Caddy network address: a path is
// a Unix socket.
func dialAddress(upstream string) string {
	if strings.HasPrefix(upstream, "/") {
		return "unix/" + upstream
	}
	return upstream
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
