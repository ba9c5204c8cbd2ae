package lchat

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/held"
	"github.com/lchat/lchat-caddy/provider"
)

// The hop to a provider (package provider): Caddy's reverse proxy over the provider's
// Conn, so streaming, WebSockets, trailers and flushing behave as for any reverse_proxy.

// provisionProviderProxies sets up one reverse proxy per provider of the app's config.
func (h *Handler) provisionProviderProxies(ctx caddy.Context, flush caddy.Duration) error {
	if cs := h.app.conns; cs != nil {
		// The events and pulls of the WebSockets this box holds for delegated spaces.
		ps := h.app.prov
		cs.SetProviders(func(name string) http.RoundTripper {
			if c := ps.conn(name); c != nil {
				return c
			}
			return nil
		})
	}
	if h.app.prov == nil {
		return nil
	}
	h.providerProxies = map[string]*reverseproxy.Handler{}
	for name, c := range h.app.prov.conns {
		p := &reverseproxy.Handler{
			Upstreams:     reverseproxy.UpstreamPool{{Dial: c.Addr()}},
			FlushInterval: flush,
			Transport:     c,
		}
		if err := p.Provision(ctx); err != nil {
			return fmt.Errorf("provisioning the proxy to provider %s: %v", name, err)
		}
		h.providerProxies[name] = p
	}
	return nil
}

// stripClient, on a provider's box, takes the provider marker off r (it never reaches
// anything else) and names the fleet that signed it for host (provider.Clients): its
// request counts as one hop, like a peer's forward, with only the headers of a held
// event stream kept (provider.ClientRequest). Empty: no valid marker, or a request a
// fleet may not make (under /.lchat/). A fleet's request of the held-connection wire
// carries its version (provider.WireHeader), which the answer (its header, answer)
// carries too; one of another version is a *provider.WireError, to be refused.
func (h *Handler) stripClient(r *http.Request, answer http.Header, host string, hops *int) (string, error) {
	var ps *providerSet
	if h.app != nil {
		ps = h.app.prov
	}
	if ps == nil {
		r.Header.Del("X-Lchat-Provider-Forwarded")
		r.Header.Del(provider.WireHeader)
		return "", nil
	}
	c := ps.clients.StripClient(r.Header, host, time.Now())
	if c != nil {
		if err := provider.CheckWire(r); err != nil {
			answer.Set(provider.WireHeader, provider.WireVersion)
			return "", err
		}
	}
	held := provider.HeldRequest(r)
	r.Header.Del(provider.WireHeader)
	if c == nil || !provider.ClientRequest(r) {
		return "", nil
	}
	if held {
		answer.Set(provider.WireHeader, provider.WireVersion)
	}
	if e := r.Header.Get(connhold.EntryHeader); e != "" {
		// The fleet's word for its entry box: recorded under the fleet's name, never
		// called (held/provider.go).
		r.Header.Set(connhold.EntryHeader, provider.ClientEntry(c.Name, e))
	}
	if *hops == 0 {
		*hops = 1
	}
	return c.Name, nil
}

// Provider forwards the request of a delegated space to its provider (box.ProviderProxy),
// Host kept. Held connections are held here, as for a space of this fleet's own: a
// resumable event stream (sse.go), which the provider leaves to this box and which it
// reopens through its provider when the space is awake there again; and a WebSocket
// whose instance opts in (forwardUpgrade), whose events go over the same hop
// (held/provider.go). A provider that gives no answer is a 503 with Retry-After for this
// space alone.
func (p *proxying) Provider(name string) error {
	pp := p.h.providerProxies[name]
	if pp == nil {
		return p.Refuse(box.Refusal{Status: http.StatusServiceUnavailable,
			Err: fmt.Errorf("space %s: its provider %s is not configured on this box", p.host, name)})
	}
	if p.hops == 0 && connhold.Reserved(p.r.URL.Path) {
		return p.reserved()
	}
	var err error
	switch cs := p.h.app.conns; {
	case cs != nil && p.hops == 0 && connhold.IsUpgrade(p.r):
		var kept bool
		if kept, err = p.forwardUpgradeVia(p.r, cs, pp); kept {
			cs.HoldForProvider(p.host, name)
		}
	case cs != nil && p.hops == 0 && (p.sse != nil || connhold.AcceptsEventStream(p.r)):
		var res box.Forwarded
		if res, err = p.forwardSSE(p.r, cs, pp); res == box.NotSent {
			return p.Refuse(box.Refusal{Status: http.StatusServiceUnavailable,
				Err: fmt.Errorf("space %s: its provider %s cannot be reached: %w", p.host, name, innerError(err))})
		}
	default:
		err = pp.ServeHTTP(p.w, p.r, p.next)
	}
	if proxyDialError(err) {
		return p.Refuse(box.Refusal{Status: http.StatusServiceUnavailable,
			Err: fmt.Errorf("space %s: its provider %s cannot be reached: %w", p.host, name, innerError(err))})
	}
	return p.noAnswer(err, "space "+p.host+": its provider "+name)
}

// instancePull, on the provider's box, answers a fleet entry box's pull of what the
// space's instance sent to the WebSockets it holds (held.Conns.ServePull), use released
// at once: a pull keeps the space awake no more than a held connection does.
func (p *proxying) instancePull(use *engine.Use, cs *held.Conns) error {
	use.Release()
	if err := cs.ServePull(p.w, p.r, p.host); err != nil {
		return caddyhttp.Error(box.StatusOf(err), err)
	}
	return nil
}

// innerError is err without the reverse proxy's HandlerError around it: a refusal
// wrapping that would keep its 502 (caddyhttp.Error returns the HandlerError it finds).
func innerError(err error) error {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.Err
	}
	return err
}

// Interface guards
var _ box.ProviderProxy = (*proxying)(nil)
