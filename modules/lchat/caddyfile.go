package lchat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
	"github.com/lchat/lchat-caddy/modules/buckets"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("lchat", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("lchat", parseHandler)
	httpcaddyfile.RegisterDirectiveOrder("lchat", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterHandlerDirective("lchat_mesh_api", parseMeshAPI)
	httpcaddyfile.RegisterDirectiveOrder("lchat_mesh_api", httpcaddyfile.Before, "redir")
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
//		max_starting <n>
//		wake_scan_interval <duration>
//		drain_timeout <duration>
//		wildcard_domains <domain...>
//		uid_range <first> <count>
//		instance_log {
//			max_size <size>
//			keep <n>
//		}
//		connections {
//			max_message <size>
//			max_pending <n>
//			max_pending_bytes <size>
//			max_box_pending_bytes <size>
//			max_out_bytes <size>
//			max_box_out_bytes <size>
//			write_timeout <duration>
//		}
//		mesh {
//			beat <duration>
//			dead_after <duration>
//			fence_margin <duration>
//			forward_timeout <duration>
//			resync_interval <duration>
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
//			retention <duration>
//			gc_grace <duration>
//			isolation on|none
//			socket_activation on|off
//			network none|egress|host {
//				allow <cidr...>
//			}
//			tmp private|host
//			limits {
//				memory <size>
//				cpu <cores>
//				pids <n>
//				disk <size>
//			}
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
		case "max_starting":
			var s string
			if err := caddyfileutil.OneArg(d, &s); err != nil {
				return err
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return d.Errf("max_starting: %v", err)
			}
			a.MaxStarting = n
		case "wake_scan_interval":
			if err := durationArg(d, &a.WakeScanInterval); err != nil {
				return err
			}
		case "drain_timeout":
			if err := durationArg(d, &a.DrainTimeout); err != nil {
				return err
			}
		case "tombstone_ttl":
			if err := durationArg(d, &a.TombstoneTTL); err != nil {
				return err
			}
		case "wildcard_domains":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.WildcardDomains = append(a.WildcardDomains, args...)
		case "uid_range":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.ArgErr()
			}
			first, err1 := strconv.ParseUint(args[0], 10, 32)
			count, err2 := strconv.ParseUint(args[1], 10, 32)
			if err := errors.Join(err1, err2); err != nil {
				return d.Errf("uid_range: %v", err)
			}
			a.UIDRange = &UIDRange{First: uint32(first), Count: uint32(count)}
		case "instance_log":
			if d.NextArg() {
				return d.ArgErr()
			}
			if a.InstanceLog == nil {
				a.InstanceLog = new(InstanceLog)
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "max_size":
					n, err := sizeArg(d)
					if err != nil {
						return err
					}
					// The rotation counts whole MiB: round up.
					a.InstanceLog.MaxSizeMB = int((n + 1<<20 - 1) >> 20)
				case "keep":
					var v string
					if err := caddyfileutil.OneArg(d, &v); err != nil {
						return err
					}
					n, err := strconv.Atoi(v)
					if err != nil {
						return d.Errf("keep: %v", err)
					}
					a.InstanceLog.Keep = n
				default:
					return d.Errf("unrecognized subdirective %s", d.Val())
				}
			}
		case "connections":
			if d.NextArg() {
				return d.ArgErr()
			}
			if a.Connections == nil {
				a.Connections = new(Connections)
			}
			if err := a.Connections.unmarshalCaddyfile(d); err != nil {
				return err
			}
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
		case "retention":
			if err := durationArg(d, &k.Retention); err != nil {
				return err
			}
		case "gc_grace":
			if err := durationArg(d, &k.GCGrace); err != nil {
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
		case "isolation":
			if err := caddyfileutil.OneArg(d, &k.Isolation); err != nil {
				return err
			}
		case "socket_activation":
			var v string
			if err := caddyfileutil.OneArg(d, &v); err != nil {
				return err
			}
			switch v {
			case "on":
				k.SocketActivation = true
			case "off":
				k.SocketActivation = false
			default:
				return d.Errf("socket_activation: %q is not on or off", v)
			}
		case "network":
			if !d.NextArg() {
				return d.ArgErr()
			}
			k.Network = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if d.Val() != "allow" {
					return d.Errf("unrecognized subdirective %s", d.Val())
				}
				args := d.RemainingArgs()
				if len(args) == 0 {
					return d.ArgErr()
				}
				for _, a := range args {
					// A placeholder is checked once expanded, in Provision.
					if _, err := engine.ParseAllow(a); err != nil && !strings.Contains(a, "{") {
						return d.Err(err.Error())
					}
				}
				k.NetworkAllow = append(k.NetworkAllow, args...)
			}
		case "tmp":
			if err := caddyfileutil.OneArg(d, &k.Tmp); err != nil {
				return err
			}
		case "limits":
			if d.NextArg() {
				return d.ArgErr()
			}
			if k.Limits == nil {
				k.Limits = new(Limits)
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "memory":
					n, err := sizeArg(d)
					if err != nil {
						return err
					}
					k.Limits.Memory = n
				case "cpu":
					var v string
					if err := caddyfileutil.OneArg(d, &v); err != nil {
						return err
					}
					f, err := strconv.ParseFloat(v, 64)
					if err != nil || f <= 0 {
						return d.Errf("cpu: want a positive share of one core (0.5, 2), got %q", v)
					}
					k.Limits.CPU = f
				case "pids":
					var v string
					if err := caddyfileutil.OneArg(d, &v); err != nil {
						return err
					}
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil || n <= 0 {
						return d.Errf("pids: want a positive number, got %q", v)
					}
					k.Limits.Pids = n
				case "disk":
					n, err := sizeArg(d)
					if err != nil {
						return err
					}
					k.Limits.Disk = n
				default:
					return d.Errf("unrecognized subdirective %s", d.Val())
				}
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// sizeArg reads one size argument (64MiB, 1GB, 1048576) as bytes.
func sizeArg(d *caddyfile.Dispenser) (int64, error) {
	name := d.Val()
	var v string
	if err := caddyfileutil.OneArg(d, &v); err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > 1<<62 {
		return 0, d.Errf("%s: want a size such as 64MiB, got %q", name, v)
	}
	return int64(n), nil
}

// unmarshalCaddyfile reads a connections block (see App.UnmarshalCaddyfile).
func (c *Connections) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch name := d.Val(); name {
		case "max_message", "max_pending_bytes", "max_box_pending_bytes", "max_out_bytes", "max_box_out_bytes":
			n, err := sizeArg(d)
			if err != nil {
				return err
			}
			switch name {
			case "max_message":
				c.MaxMessage = int(min(n, 1<<31-1))
			case "max_pending_bytes":
				c.MaxPendingBytes = int(min(n, 1<<31-1))
			case "max_box_pending_bytes":
				c.MaxBoxPendingBytes = n
			case "max_out_bytes":
				c.MaxOutBytes = int(min(n, 1<<31-1))
			case "max_box_out_bytes":
				c.MaxBoxOutBytes = n
			}
		case "max_pending":
			var v string
			if err := caddyfileutil.OneArg(d, &v); err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("max_pending: want a positive number, got %q", v)
			}
			c.MaxPending = n
		case "write_timeout":
			var v string
			if err := caddyfileutil.OneArg(d, &v); err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("write_timeout: want a positive duration, got %q", v)
			}
			c.WriteTimeout = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized subdirective %s", name)
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

// unmarshalCaddyfile reads the `mesh` block of the lchat global option.
//
// Syntax:
//
//	mesh {
//		beat <duration>
//		dead_after <duration>
//		fence_margin <duration>
//		forward_timeout <duration>
//		resync_interval <duration>
//		trusted_ca_files <pem...>
//		public_address <ip>
//		relocate_dns {
//			provider <name> ...
//			zone <zone>
//			ttl <duration>
//		}
//		region_bucket <region> <backend> ...
//	}
func (o *MeshOptions) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "beat":
			if err := durationArg(d, &o.Beat); err != nil {
				return err
			}
		case "dead_after":
			if err := durationArg(d, &o.DeadAfter); err != nil {
				return err
			}
		case "fence_margin":
			if err := durationArg(d, &o.FenceMargin); err != nil {
				return err
			}
		case "forward_timeout":
			if err := durationArg(d, &o.ForwardTimeout); err != nil {
				return err
			}
		case "resync_interval":
			if err := durationArg(d, &o.ResyncInterval); err != nil {
				return err
			}
		case "public_address":
			if err := caddyfileutil.OneArg(d, &o.PublicAddress); err != nil {
				return err
			}
		case "relocate_dns":
			if o.RelocateDNS != nil {
				return d.Err("relocate_dns given twice")
			}
			o.RelocateDNS = new(RelocateDNS)
			if err := o.RelocateDNS.unmarshalCaddyfile(d); err != nil {
				return err
			}
		case "region_bucket":
			if !d.NextArg() {
				return d.ArgErr()
			}
			region := d.Val()
			if _, dup := o.RegionBucketsRaw[region]; dup {
				return d.Errf("region_bucket %s given twice", region)
			}
			raw, err := buckets.UnmarshalBucket(d)
			if err != nil {
				return err
			}
			if o.RegionBucketsRaw == nil {
				o.RegionBucketsRaw = make(map[string]json.RawMessage)
			}
			o.RegionBucketsRaw[region] = raw
		case "trusted_ca_files":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			o.TrustedCAFiles = append(o.TrustedCAFiles, args...)
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// unmarshalCaddyfile reads a relocate_dns block.
//
//	relocate_dns {
//		provider <name> ...
//		zone <zone>
//		ttl <duration>
//	}
func (r *RelocateDNS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "provider":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			unm, err := caddyfile.UnmarshalModule(d, "dns.providers."+name)
			if err != nil {
				return err
			}
			r.ProviderRaw = caddyconfig.JSONModuleObject(unm, "name", name, nil)
		case "zone":
			if err := caddyfileutil.OneArg(d, &r.Zone); err != nil {
				return err
			}
		case "ttl":
			if err := durationArg(d, &r.TTL); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// parseMeshAPI sets up the handler from the `lchat_mesh_api` directive.
//
// Syntax:
//
//	lchat_mesh_api {
//		max_row_bytes <n>
//	}
func parseMeshAPI(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(MeshAPI)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens; see parseMeshAPI.
func (h *MeshAPI) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "max_row_bytes":
			var s string
			if err := caddyfileutil.OneArg(d, &s); err != nil {
				return err
			}
			var n int64
			if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
				return d.Errf("max_row_bytes: want a positive number, got %q", s)
			}
			h.MaxRowBytes = n
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*MeshAPI)(nil)
)
