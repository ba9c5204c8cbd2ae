package dnsimple

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile sets up the provider from Caddyfile tokens. The single
// argument is the API token.
//
// Syntax:
//
//	dnsimple [<api_access_token>] {
//	    api_access_token <token>
//	    account_id       <id>
//	    api_url          <url>
//	}
func (p *Provider) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // provider name
	if d.NextArg() {
		p.APIAccessToken = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var dst *string
		switch d.Val() {
		case "api_access_token":
			dst = &p.APIAccessToken
		case "account_id":
			dst = &p.AccountID
		case "api_url":
			dst = &p.APIURL
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Provider)(nil)
