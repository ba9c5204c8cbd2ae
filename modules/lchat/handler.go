package lchat

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/gate"
	"github.com/lchat/lchat-caddy/held"
	"github.com/lchat/lchat-caddy/mesh"
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
// connection it upgrades to) holds the space awake until it ends. A 404 for an unknown
// host and a 503 come with a short page (pages.go) unless the site has error routes; no
// answer carries the Lchat-Sse mark (held.ClientWriter).
type Handler struct {
	// FlushInterval is the proxy's flush interval. Default -1: flush at once, so
	// server-sent events and streamed responses are not held back.
	FlushInterval *caddy.Duration `json:"flush_interval,omitempty"`

	// RetryAfter is the Retry-After of a 503 when another box holds the space's
	// lease or the engine gives no better hint. Default 5s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	app       *App
	logger    *zap.Logger
	proxy     *reverseproxy.Handler
	meshProxy *reverseproxy.Handler // forwards to peers; nil without the mesh
	// providerProxies forward to this config's providers, by name (providerfwd.go).
	providerProxies map[string]*reverseproxy.Handler
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
	appIface, err := ctx.App("lchat")
	if err != nil {
		return fmt.Errorf("getting lchat app: %v", err)
	}
	h.app = appIface.(*App)
	h.logger = ctx.Logger()
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
	return h.provisionProviderProxies(ctx, flush)
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

// log is the handler's logger (a handler made without Provision, in tests: none).
func (h *Handler) log() *zap.Logger {
	if h.logger == nil {
		return zap.NewNop()
	}
	return h.logger
}

// Cleanup releases the embedded proxy.
func (h *Handler) Cleanup() error {
	if h.meshProxy != nil {
		h.meshProxy.Cleanup()
	}
	for _, pp := range h.providerProxies {
		pp.Cleanup()
	}
	if h.proxy != nil {
		return h.proxy.Cleanup()
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler: the box decides (box.Box.Serve),
// the request's proxying carries its decisions out.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	b := h.app.box
	b.Count()
	host := requestHost(r)
	hops, viaHint := b.Strip(r.Header, host)
	client, err := h.stripClient(r, w.Header(), host, &hops)
	if err != nil {
		// A fleet's held-connection request of another wire version: refused before
		// anything acts on it (an event: before any instance saw it).
		if r.URL.Path == connhold.EventPath {
			w.Header().Set(connhold.RefusedHeader, "1")
		}
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil
	}
	if hops == 0 {
		if err := h.app.conns.FromClient(r, w.Header()); err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
	}
	// Every answer goes out through one writer that takes the Lchat-Sse mark off, except
	// to the entry box that holds the client's event stream (connhold.EntryHeader).
	out := held.NewClientWriter(w, hops > 0 && r.Header.Get(connhold.EntryHeader) != "")
	p := &proxying{h: h, w: out, out: out, r: r, next: next, host: host, hops: hops}
	// A peer reopening an event stream it holds: never a wake (box.Request.Reopen).
	reopen := hops > 0 && r.Header.Get(connhold.ReopenHeader) != ""
	err = b.Serve(r.Context(), box.Request{Host: host, Hops: hops, ViaHint: viaHint, Reopen: reopen, Client: client}, p)
	return p.answerPage(err)
}

// proxying carries out the box's decisions for one request (box.Proxy) with the
// handler's reverse proxies.
type proxying struct {
	h *Handler
	w http.ResponseWriter
	// out is the writer the request's answer leaves through (ServeHTTP's), below any the
	// doors put in p.w; nil on a reopen of a held stream, whose client's answer is sent.
	out  *held.ClientWriter
	r    *http.Request
	next caddyhttp.Handler
	host string
	hops int // forwards before this box
	// sse, on a reopen of a resumable event stream this box holds (heldStream), is the
	// stream's writer: the request is one pass of it.
	sse *held.SSEWriter
}

// Live proxies to a live route's upstream.
func (p *proxying) Live(upstream string) error {
	setUpstream(p.r, dialAddress(upstream))
	return p.h.proxy.ServeHTTP(p.w, p.r, p.next)
}

// Instance proxies to the awake instance. On the response to a forwarded request it notes
// that the space is awake here (mesh.HolderHeader), so the boxes that forwarded it send
// the next requests here directly.
func (p *proxying) Instance(use *engine.Use) error {
	if p.hops > 0 {
		p.w.Header().Set(mesh.HolderHeader, p.h.app.box.Self())
	}
	cs := p.h.app.conns
	door := cs.DoorOf(p.r, p.hops)
	if door == held.Reserved {
		return p.reserved()
	}
	if door == held.ClientPull {
		// A fleet's entry box pulling what its held WebSockets get (providerfwd.go).
		return p.instancePull(use, cs)
	}
	if cs != nil && p.h.app.box.Mesh() != nil {
		// Its instance may send to connections held at any box (held.Conns.EnsureControl).
		cs.EnsureControl(p.host)
	}
	p.h.setInstanceHeader(p.w, use)
	setUpstream(p.r, use.Dial())
	if gw := p.gateWriter(use, p.w, door); gw != nil && door != held.EventStream {
		// An event stream passes its gate per pass (proxySSE): a held one is proxied
		// again after each wake, through that wake's gate.
		p.w = gw
		defer gw.Finish()
	}
	var err error
	switch door {
	case held.PeerEvent:
		err = p.instanceEvent(use, cs)
	case held.PeerUpgrade:
		err = p.instanceUpgradeForEntry(use, cs)
	case held.Upgrade:
		err = p.instanceUpgrade(use, cs)
	case held.EventStream:
		err = p.instanceSSE(use, cs)
	default:
		err = p.h.proxy.ServeHTTP(p.w, p.r, p.next)
	}
	if proxyDialError(err) {
		// The engine holds the space awake but its socket takes no connection: end
		// that awake period so the next request wakes a working instance.
		use.Unreachable()
	}
	return p.noAnswer(err, "space "+p.host+": its instance")
}

// gateWriter is the writer that holds the instance's answer to w at use's output gate
// (Kind.Durability bucket), nil when its kind acknowledges at checkpoints: every part of
// the answer waits until the commits before it are in the bucket, or the answer is the
// box's 503 page; one without a body passes at Finish.
func (p *proxying) gateWriter(use *engine.Use, w http.ResponseWriter, door held.Door) *gate.Writer {
	g := use.Gate()
	if g == nil {
		return nil
	}
	ra := int(time.Duration(p.h.RetryAfter) / time.Second)
	cfg := gate.WriterConfig{
		RetryAfter: ra, Timeout: engine.DurableAnswerTimeout,
		Refuse: func(w http.ResponseWriter) {
			writePage(w, p.r, http.StatusServiceUnavailable, p.host, &pageError{kind: pageUnavailable, retryAfter: ra})
		}}
	if door == held.PeerEvent {
		cfg.Passed = held.DurableStamp(use)
	}
	return gate.NewWriter(p.r.Context(), w, g, cfg)
}

// Refuse answers ref, with Retry-After on a 503.
func (p *proxying) Refuse(ref box.Refusal) error {
	if p.hops > 0 && p.r.URL.Path == connhold.EventPath {
		// The box's own refusal, before any instance: the holding box's next try is not
		// a redelivery (held.Conns.Deliver).
		p.w.Header().Set(connhold.RefusedHeader, "1")
	}
	return p.refuse(ref)
}

// refuse is Refuse without saying that no instance saw the request. A 404 (the box has
// no route for the host) and a 503 are answered with their page (answerPage).
func (p *proxying) refuse(ref box.Refusal) error {
	err := ref.Err
	switch ref.Status {
	case http.StatusNotFound:
		err = &pageError{kind: pageUnknownHost, err: err}
	case http.StatusServiceUnavailable:
		after := ref.RetryAfter
		if after <= 0 {
			after = time.Duration(p.h.RetryAfter)
		}
		err = &pageError{kind: pageUnavailable, retryAfter: setRetryAfter(p.w, after), err: err}
	}
	return caddyhttp.Error(ref.Status, err)
}

// reserved refuses a client's request under the box's own namespace (connhold.Reserved)
// on a route that exists: a plain 404, not the page of an unknown host.
func (p *proxying) reserved() error {
	return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("%s is reserved for the box", p.r.URL.Path))
}

// noAnswer turns the reverse proxy's error for a request its upstream (an instance, a
// peer: who) never answered (box.NoAnswer) into a 503 with Retry-After. Any other error,
// and a 502 the upstream itself answered (its own response), passes unchanged.
func (p *proxying) noAnswer(err error, who string) error {
	var he caddyhttp.HandlerError
	if err == nil || !errors.As(err, &he) || !box.NoAnswer(he.StatusCode) {
		return err
	}
	p.w.Header().Del(InstanceHeader)
	return p.refuse(box.Refusal{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("%s gave no answer: %w", who, he.Err)})
}

// setUpstream tells the embedded reverse proxy where to dial for this request.
func setUpstream(r *http.Request, dial string) {
	r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).Set(upstreamPlaceholder, dial)
}

// setRetryAfter sets Retry-After to d in whole seconds (at least 1, rounded up) and
// returns them.
func setRetryAfter(w http.ResponseWriter, d time.Duration) int {
	secs := int(math.Ceil(max(d, time.Second).Seconds()))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	return secs
}

// requestHost is the request's host in the form every comparison of hosts uses
// (mesh.NormalizeHost), so that the lookup here, the marker a peer signed and the
// placement agree on it.
func requestHost(r *http.Request) string {
	return mesh.NormalizeHost(r.Host)
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
	_ box.Proxy                   = (*proxying)(nil)
)
