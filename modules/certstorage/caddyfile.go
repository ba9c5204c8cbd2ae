package certstorage

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/modules/buckets"
)

// UnmarshalCaddyfile sets up the storage from Caddyfile tokens (the global
// `storage lchat { ... }` option). The bucket block is the lchat.buckets module of
// that name with its own syntax.
//
// Syntax:
//
//	lchat {
//	    bucket <backend> [<args...>] {
//	        ...
//	    }
//	    prefix       <prefix>
//	    lock_ttl     <duration>
//	    lock_refresh <duration>
//	    lock_poll    <duration>
//	}
func (m *Module) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "bucket":
			raw, err := buckets.UnmarshalBucket(d)
			if err != nil {
				return err
			}
			m.BucketRaw = raw
		case "prefix":
			if !d.NextArg() {
				return d.ArgErr()
			}
			m.Prefix = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "lock_ttl", "lock_refresh", "lock_poll":
			opt := d.Val()
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("invalid %s %q: %v", opt, d.Val(), err)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			switch opt {
			case "lock_ttl":
				m.LockTTL = caddy.Duration(dur)
			case "lock_refresh":
				m.LockRefresh = caddy.Duration(dur)
			default:
				m.LockPoll = caddy.Duration(dur)
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Module)(nil)
