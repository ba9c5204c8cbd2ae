package proxyprotocol

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile sets the wrapper up from the `servers` option's listener_wrappers.
// Syntax:
//
//	lchat_proxy_protocol {
//		allow <addresses...>
//		timeout <duration>
//	}
//
// `allow` may be repeated, and may be given no address (an unset environment variable):
// then no header is read from anyone.
func (w *Wrapper) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the wrapper's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "allow":
			w.Allow = append(w.Allow, d.RemainingArgs()...)
		case "timeout":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("parsing timeout %q: %v", d.Val(), err)
			}
			w.Timeout = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Wrapper)(nil)
