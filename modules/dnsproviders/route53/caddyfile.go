package route53

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
)

// UnmarshalCaddyfile sets up the provider from Caddyfile tokens. The single
// argument is the hosted zone id.
//
// Syntax:
//
//	route53 [<hosted_zone_id>] {
//	    hosted_zone_id    <id>
//	    region            <region>
//	    profile           <profile>
//	    access_key_id     <key_id>
//	    secret_access_key <secret>
//	    session_token     <token>
//	    max_retries       <n>
//	    wait_for_sync
//	    max_wait          <duration>
//	}
func (p *Provider) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // provider name
	if d.NextArg() {
		p.HostedZoneID = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "hosted_zone_id":
			if err := caddyfileutil.OneArg(d, &p.HostedZoneID); err != nil {
				return err
			}
		case "region":
			if err := caddyfileutil.OneArg(d, &p.Region); err != nil {
				return err
			}
		case "profile":
			if err := caddyfileutil.OneArg(d, &p.Profile); err != nil {
				return err
			}
		case "access_key_id":
			if err := caddyfileutil.OneArg(d, &p.AccessKeyID); err != nil {
				return err
			}
		case "secret_access_key":
			if err := caddyfileutil.OneArg(d, &p.SecretAccessKey); err != nil {
				return err
			}
		case "session_token":
			if err := caddyfileutil.OneArg(d, &p.SessionToken); err != nil {
				return err
			}
		case "max_retries":
			var s string
			if err := caddyfileutil.OneArg(d, &s); err != nil {
				return err
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return d.Errf("invalid max_retries %q", s)
			}
			p.MaxRetries = n
		case "wait_for_sync":
			if d.NextArg() {
				return d.ArgErr()
			}
			p.WaitForSync = true
		case "max_wait":
			var s string
			if err := caddyfileutil.OneArg(d, &s); err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(s)
			if err != nil {
				return d.Errf("invalid max_wait %q: %v", s, err)
			}
			p.MaxWait = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Provider)(nil)
