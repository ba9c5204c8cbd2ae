package console

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("lchat_console", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("lchat_console", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(Handler)
	err := c.UnmarshalCaddyfile(h.Dispenser)
	return c, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens.
//
// Syntax:
//
//	lchat_console {
//		actions
//		sample_interval <duration>
//		page_size <n>
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "actions":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.Actions = true
		case "sample_interval":
			var v string
			if err := caddyfileutil.OneArg(d, &v); err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("sample_interval: %v", err)
			}
			h.SampleInterval = caddy.Duration(dur)
		case "page_size":
			var v string
			if err := caddyfileutil.OneArg(d, &v); err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("page_size: want a positive number, got %q", v)
			}
			h.PageSize = n
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
