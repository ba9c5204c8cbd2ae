// Package proxyprotocol is caddy.listeners.lchat_proxy_protocol: the PROXY protocol from
// the network load balancers in front of a box (proxyproto), so its logs, the console and
// anything that reads the client address see the client, not the balancer.
//
// It exists beside Caddy's own proxy_protocol wrapper because that one reads through a
// buffer: bytes past the header can sit there, so a WebSocket the box holds (connhold)
// could not be parked by its socket, and the box refuses to hold it. This one reads the
// header exactly.
package proxyprotocol

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/proxyproto"
)

func init() {
	caddy.RegisterModule(Wrapper{})
}

// Wrapper accepts a PROXY protocol header (v1 or v2) on connections from the balancers'
// addresses (Allow) and takes the client's address from it; a connection from any other
// address is served as it came (a header it sends is not read, so TLS or HTTP refuses
// it). A connection from an allowed address without a header (a peer box in the same
// range, a balancer's TCP health check) keeps its own address. List it before the tls
// wrapper: the header comes before TLS.
type Wrapper struct {
	// Allow are the balancers' addresses: IPs or CIDR prefixes (an element may hold
	// several, separated by commas or spaces, as an environment variable does). Empty:
	// no header is read from anyone. Default empty.
	Allow []string `json:"allow,omitempty"`
	// Timeout bounds the wait for a header's bytes on a new connection. Default 5s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	allow []netip.Prefix
}

// CaddyModule returns the Caddy module information.
func (Wrapper) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.listeners.lchat_proxy_protocol",
		New: func() caddy.Module { return new(Wrapper) },
	}
}

// Provision parses the addresses.
func (w *Wrapper) Provision(ctx caddy.Context) error {
	var specs []string
	for _, a := range w.Allow {
		specs = append(specs, strings.FieldsFunc(a, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })...)
	}
	allow, err := proxyproto.ParseAllow(specs)
	if err != nil {
		return fmt.Errorf("lchat_proxy_protocol: allow: %v", err)
	}
	w.allow = allow
	if w.Timeout == 0 {
		w.Timeout = caddy.Duration(proxyproto.DefaultTimeout)
	}
	if w.Timeout < 0 {
		return fmt.Errorf("lchat_proxy_protocol: timeout %s is negative", time.Duration(w.Timeout))
	}
	if len(allow) == 0 {
		ctx.Logger().Debug("PROXY protocol accepted from no address: allow is empty")
	} else {
		ctx.Logger().Info("PROXY protocol accepted from the balancers", zap.Stringers("allow", allow))
	}
	return nil
}

// WrapListener reads headers from the allowed addresses; with none, it is l itself.
func (w *Wrapper) WrapListener(l net.Listener) net.Listener {
	if len(w.allow) == 0 {
		return l
	}
	return &proxyproto.Listener{Listener: l, Allow: w.allow, Timeout: time.Duration(w.Timeout)}
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Wrapper)(nil)
	_ caddy.ListenerWrapper = (*Wrapper)(nil)
)
