package buckets

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
)

// UnmarshalCaddyfile sets up an S3 bucket from Caddyfile tokens. Syntax:
//
//	s3 [<bucket>] {
//	    bucket            <name>
//	    prefix            <prefix>
//	    region            <region>
//	    endpoint          <http(s)://host[:port]>
//	    use_path_style    # default on when an endpoint is configured
//	    virtual_host      # keep virtual-hosted style with an endpoint
//	    access_key_id     <id>
//	    secret_access_key <secret>
//	    session_token     <token>
//	}
func (s *S3) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		s.Bucket = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for d.NextBlock(0) {
		var field *string
		switch d.Val() {
		case "bucket":
			field = &s.Bucket
		case "prefix":
			field = &s.Prefix
		case "region":
			field = &s.Region
		case "endpoint":
			field = &s.Endpoint
		case "access_key_id":
			field = &s.AccessKeyID
		case "secret_access_key":
			field = &s.SecretAccessKey
		case "session_token":
			field = &s.SessionToken
		case "use_path_style":
			if d.NextArg() {
				return d.ArgErr()
			}
			s.UsePathStyle = true
			continue
		case "virtual_host":
			if d.NextArg() {
				return d.ArgErr()
			}
			s.VirtualHost = true
			continue
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
		if err := caddyfileutil.OneArg(d, field); err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up a file bucket from Caddyfile tokens. Syntax:
//
//	file [<root>] {
//	    root   <directory>
//	    prefix <prefix>
//	}
func (f *File) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		f.Root = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "root":
			if err := caddyfileutil.OneArg(d, &f.Root); err != nil {
				return err
			}
		case "prefix":
			if err := caddyfileutil.OneArg(d, &f.Prefix); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// UnmarshalBucket parses a `bucket <backend> ...` line (the backend's own Caddyfile
// syntax follows the name) into the JSON of an `lchat.buckets` guest module, for the
// modules that keep state in a bucket (the lchat app, caddy.storage.lchat). The
// dispenser is on the `bucket` token.
func UnmarshalBucket(d *caddyfile.Dispenser) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	name := d.Val()
	unm, err := caddyfile.UnmarshalModule(d, "lchat.buckets."+name)
	if err != nil {
		return nil, err
	}
	return caddyconfig.JSONModuleObject(unm, "backend", name, nil), nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*S3)(nil)
	_ caddyfile.Unmarshaler = (*File)(nil)
)
