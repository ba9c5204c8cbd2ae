package lchat

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
	"github.com/lchat/lchat-caddy/modules/buckets"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("lchat", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("lchat", parseHandler)
	httpcaddyfile.RegisterDirectiveOrder("lchat", httpcaddyfile.Before, "reverse_proxy")
}

// parseGlobalOption sets up the lchat app from the global option. Repeated blocks
// merge into one app.
//
// Syntax:
//
//	lchat {
//		bucket <backend> ...
//		state_dir <path>
//		registry <path>
//		max_awake <n>
//		wake_scan_interval <duration>
//		drain_timeout <duration>
//		wildcard_domains <domain...>
//		mesh {
//			beat <duration>
//			dead_after <duration>
//			fence_margin <duration>
//			forward_timeout <duration>
//			trusted_ca_files <pem...>
//		}
//		kind <name> {
//			command <cmd> [<args...>]
//			args <args...>
//			env <NAME> <value>
//			allowed_env <NAME...>
//			idle_timeout <duration>
//			stop_signal <signal>
//			stop_grace <duration>
//			ready_path <path>
//			ready_timeout <duration>
//			replication sleep|continuous|periodic [<interval>]
//			wake_path <path>
//		}
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	app := new(App)
	if existing != nil {
		prev, ok := existing.(httpcaddyfile.App)
		if !ok {
			return nil, d.Errf("lchat: unexpected existing value %T", existing)
		}
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, d.Errf("lchat: merging repeated option: %v", err)
		}
	}
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "lchat", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from Caddyfile tokens; see parseGlobalOption
// for the syntax.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option name
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
			a.BucketRaw = raw
		case "state_dir":
			if err := caddyfileutil.OneArg(d, &a.StateDir); err != nil {
				return err
			}
		case "registry":
			if err := caddyfileutil.OneArg(d, &a.Registry); err != nil {
				return err
			}
		case "max_awake":
			var s string
			if err := caddyfileutil.OneArg(d, &s); err != nil {
				return err
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return d.Errf("max_awake: %v", err)
			}
			a.MaxAwake = n
		case "wake_scan_interval":
			if err := durationArg(d, &a.WakeScanInterval); err != nil {
				return err
			}
		case "drain_timeout":
			if err := durationArg(d, &a.DrainTimeout); err != nil {
				return err
			}
		case "wildcard_domains":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.WildcardDomains = append(a.WildcardDomains, args...)
		case "mesh":
			if a.Mesh == nil {
				a.Mesh = new(MeshOptions)
			}
			if err := a.Mesh.unmarshalCaddyfile(d); err != nil {
				return err
			}
		case "kind":
			var name string
			if err := caddyfileutil.OneArg(d, &name); err != nil {
				return err
			}
			if a.Kinds == nil {
				a.Kinds = make(map[string]*Kind)
			}
			k := a.Kinds[name]
			if k == nil {
				k = new(Kind)
				a.Kinds[name] = k
			}
			if err := k.unmarshalCaddyfile(d); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

func (k *Kind) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "command":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			k.Command, k.Args = args[0], args[1:]
		case "args":
			k.Args = d.RemainingArgs()
		case "env":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.ArgErr()
			}
			if k.Env == nil {
				k.Env = make(map[string]string)
			}
			k.Env[args[0]] = args[1]
		case "allowed_env":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			k.AllowedEnv = append(k.AllowedEnv, args...)
		case "idle_timeout":
			if err := durationArg(d, &k.IdleTimeout); err != nil {
				return err
			}
		case "stop_signal":
			if err := caddyfileutil.OneArg(d, &k.StopSignal); err != nil {
				return err
			}
		case "stop_grace":
			if err := durationArg(d, &k.StopGrace); err != nil {
				return err
			}
		case "ready_path":
			if err := caddyfileutil.OneArg(d, &k.ReadyPath); err != nil {
				return err
			}
		case "ready_timeout":
			if err := durationArg(d, &k.ReadyTimeout); err != nil {
				return err
			}
		case "wake_path":
			if err := caddyfileutil.OneArg(d, &k.WakePath); err != nil {
				return err
			}
		case "replication":
			args := d.RemainingArgs()
			if len(args) == 0 || len(args) > 2 {
				return d.ArgErr()
			}
			r := &Replication{Class: strings.ToLower(args[0])}
			if len(args) == 2 {
				dur, err := caddy.ParseDuration(args[1])
				if err != nil {
					return d.Errf("replication interval: %v", err)
				}
				r.Interval = caddy.Duration(dur)
			}
			k.Replication = r
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// parseHandler sets up the handler from the `lchat` directive.
//
// Syntax:
//
//	lchat {
//		flush_interval <duration>
//		retry_after <duration>
//	}
func parseHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens; see parseHandler.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "flush_interval":
			var fi caddy.Duration
			if err := durationArg(d, &fi); err != nil {
				return err
			}
			h.FlushInterval = &fi
		case "retry_after":
			if err := durationArg(d, &h.RetryAfter); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	var s string
	if err := caddyfileutil.OneArg(d, &s); err != nil {
		return err
	}
	if s == "-1" {
		*dst = caddy.Duration(-1)
		return nil
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s: %v", name, err)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
)
