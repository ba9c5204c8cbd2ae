package lchat

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("lchat", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("lchat", parseHandler)
	httpcaddyfile.RegisterDirectiveOrder("lchat", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterHandlerDirective("lchat_mesh_api", parseMeshAPI)
	httpcaddyfile.RegisterDirectiveOrder("lchat_mesh_api", httpcaddyfile.Before, "redir")
	httpcaddyfile.RegisterHandlerDirective("lchat_health", parseHealth)
	httpcaddyfile.RegisterDirectiveOrder("lchat_health", httpcaddyfile.Before, "redir")
	httpcaddyfile.RegisterHandlerDirective("lchat_provider_api", parseProviderAPI)
	httpcaddyfile.RegisterDirectiveOrder("lchat_provider_api", httpcaddyfile.Before, "redir")
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
//			durability bucket|standby|checkpoint
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
//		provider <name> {
//			url <https://host[:port]>
//			token <placeholder>
//			accept_token <placeholder>
//			domains <domain...>
//			max_spaces <n>
//			trusted_ca_files <pem...>
//			dial_timeout <duration>
//			response_header_timeout <duration>
//			max_response_bytes <size>
//			max_export_bytes <size>
//		}
//		provider_client <name> {
//			token <placeholder>
//			sign_token <placeholder>
//			domains <domain...>
//			max_spaces <n>
//			max_export_bytes <size>
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
	scalars := map[string]any{
		"state_dir":          &a.StateDir,
		"registry":           &a.Registry,
		"max_awake":          &a.MaxAwake,
		"max_starting":       &a.MaxStarting,
		"wake_scan_interval": &a.WakeScanInterval,
		"drain_timeout":      &a.DrainTimeout,
		"tombstone_ttl":      &a.TombstoneTTL,
	}
	for d.NextBlock(0) {
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
		switch d.Val() {
		case "bucket":
			raw, err := buckets.UnmarshalBucket(d)
			if err != nil {
				return err
			}
			a.BucketRaw = raw
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
			logScalars := map[string]any{
				// The rotation counts whole MiB.
				"max_size": mebibytes(&a.InstanceLog.MaxSizeMB),
				"keep":     &a.InstanceLog.Keep,
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if ok, err := scalarArg(d, logScalars); ok {
					if err != nil {
						return err
					}
					continue
				}
				return d.Errf("unrecognized subdirective %s", d.Val())
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
		case "provider":
			if err := a.unmarshalProvider(d); err != nil {
				return err
			}
		case "provider_client":
			if err := a.unmarshalProviderClient(d); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

func (k *Kind) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	scalars := map[string]any{
		"idle_timeout":      &k.IdleTimeout,
		"stop_signal":       &k.StopSignal,
		"stop_grace":        &k.StopGrace,
		"ready_path":        &k.ReadyPath,
		"ready_timeout":     &k.ReadyTimeout,
		"wake_path":         &k.WakePath,
		"retention":         &k.Retention,
		"gc_grace":          &k.GCGrace,
		"isolation":         &k.Isolation,
		"socket_activation": &k.SocketActivation,
		"tmp":               &k.Tmp,
		"durability":        &k.Durability,
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
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
		case "limits":
			if d.NextArg() {
				return d.ArgErr()
			}
			if k.Limits == nil {
				k.Limits = new(Limits)
			}
			limitScalars := map[string]any{
				"memory": &k.Limits.Memory,
				"pids":   positiveInt64(&k.Limits.Pids),
				"disk":   &k.Limits.Disk,
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if ok, err := scalarArg(d, limitScalars); ok {
					if err != nil {
						return err
					}
					continue
				}
				switch d.Val() {
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

// unmarshalCaddyfile reads a connections block (see App.UnmarshalCaddyfile).
func (c *Connections) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	scalars := map[string]any{
		"max_message":           intSize(&c.MaxMessage),
		"max_pending":           positiveInt(&c.MaxPending),
		"max_pending_bytes":     intSize(&c.MaxPendingBytes),
		"max_box_pending_bytes": &c.MaxBoxPendingBytes,
		"max_out_bytes":         intSize(&c.MaxOutBytes),
		"max_box_out_bytes":     &c.MaxBoxOutBytes,
		"write_timeout":         positiveDuration(&c.WriteTimeout),
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
		return d.Errf("unrecognized subdirective %s", d.Val())
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
	scalars := map[string]any{
		"flush_interval": &h.FlushInterval,
		"retry_after":    &h.RetryAfter,
	}
	for d.NextBlock(0) {
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
		return d.Errf("unrecognized subdirective %s", d.Val())
	}
	return nil
}

// Destinations of scalarArg beyond the plain types.
type (
	// positiveInt is a number above zero.
	positiveInt *int
	// positiveInt64 is a number above zero.
	positiveInt64 *int64
	// positiveDuration is a duration above zero (-1 is not one).
	positiveDuration *caddy.Duration
	// intSize is a size in bytes held in an int, capped at 1<<31-1.
	intSize *int
	// mebibytes is a size in whole MiB, rounded up.
	mebibytes *int
)

// scalarArg reads the current subdirective's one argument into its destination in
// fields, if fields names it, and reports whether it did; when it did not, err is nil.
// The destination's type says how the argument reads:
//
//	*string           as it is
//	*bool             on or off
//	*int              a number
//	*caddy.Duration   a duration (10s, 1h30m), or -1
//	**caddy.Duration  the same, for a field whose nil means unset
//	*int64            a size (64MiB, 1GB, 1048576) in bytes
//	positiveInt, positiveInt64, positiveDuration, intSize, mebibytes: see their types
//
// A missing or an extra argument is d.ArgErr().
func scalarArg(d *caddyfile.Dispenser, fields map[string]any) (ok bool, err error) {
	name := d.Val()
	dst, ok := fields[name]
	if !ok {
		return false, nil
	}
	if dst, ok := dst.(*string); ok {
		return true, caddyfileutil.OneArg(d, dst)
	}
	var v string
	if err := caddyfileutil.OneArg(d, &v); err != nil {
		return true, err
	}
	switch dst := dst.(type) {
	case *bool:
		switch v {
		case "on":
			*dst = true
		case "off":
			*dst = false
		default:
			return true, d.Errf("%s: %q is not on or off", name, v)
		}
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return true, d.Errf("%s: %v", name, err)
		}
		*dst = n
	case positiveInt:
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return true, d.Errf("%s: want a positive number, got %q", name, v)
		}
		*dst = n
	case positiveInt64:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return true, d.Errf("%s: want a positive number, got %q", name, v)
		}
		*dst = n
	case *caddy.Duration, **caddy.Duration:
		dur := caddy.Duration(-1)
		if v != "-1" {
			parsed, err := caddy.ParseDuration(v)
			if err != nil {
				return true, d.Errf("%s: %v", name, err)
			}
			dur = caddy.Duration(parsed)
		}
		switch dst := dst.(type) {
		case *caddy.Duration:
			*dst = dur
		case **caddy.Duration:
			*dst = &dur
		}
	case positiveDuration:
		dur, err := caddy.ParseDuration(v)
		if err != nil || dur <= 0 {
			return true, d.Errf("%s: want a positive duration, got %q", name, v)
		}
		*dst = caddy.Duration(dur)
	case *int64, intSize, mebibytes:
		n, err := humanize.ParseBytes(v)
		if err != nil || n == 0 || n > 1<<62 {
			return true, d.Errf("%s: want a size such as 64MiB, got %q", name, v)
		}
		switch dst := dst.(type) {
		case *int64:
			*dst = int64(n)
		case intSize:
			*dst = int(min(n, 1<<31-1))
		case mebibytes:
			*dst = int((n + 1<<20 - 1) >> 20)
		}
	default:
		// A table in this file names a type this switch does not know.
		panic(fmt.Sprintf("scalarArg: %s: destination of type %T", name, dst))
	}
	return true, nil
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
//		memory_budget <size>
//		balance_factor <percent>|-1
//		autoscale_headroom <percent>
//		autoscale_hysteresis <percent>
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
	scalars := map[string]any{
		"beat":            &o.Beat,
		"dead_after":      &o.DeadAfter,
		"fence_margin":    &o.FenceMargin,
		"forward_timeout": &o.ForwardTimeout,
		"resync_interval": &o.ResyncInterval,
		"public_address":  &o.PublicAddress,
		// memory and autoscaling: docs/operations.md "Capacity and autoscaling"
		"memory_budget":        &o.MemoryBudget,
		"balance_factor":       &o.BalanceFactor,
		"autoscale_headroom":   &o.AutoscaleHeadroom,
		"autoscale_hysteresis": &o.AutoscaleHysteresis,
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
		switch d.Val() {
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
	scalars := map[string]any{"zone": &r.Zone, "ttl": &r.TTL}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
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
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// unmarshalProvider reads a `provider <name> {...}` block of the lchat global option
// into a ProviderConfig (see parseGlobalOption for the syntax). What can be checked
// before placeholders are expanded is checked here, with the line; the rest, and the
// defaults, in Provision, as for JSON.
func (a *App) unmarshalProvider(d *caddyfile.Dispenser) error {
	var name string
	if err := caddyfileutil.OneArg(d, &name); err != nil {
		return err
	}
	if err := registry.ValidateProviderName(name); err != nil {
		return d.Err(err.Error())
	}
	for _, o := range a.Providers {
		if o != nil && o.Name == name {
			return d.Errf("provider %s given twice", name)
		}
	}
	pc := &ProviderConfig{Name: name}
	scalars := map[string]any{
		"url":                     &pc.URL,
		"dial_timeout":            positiveDuration(&pc.DialTimeout),
		"response_header_timeout": positiveDuration(&pc.ResponseHeaderTimeout),
		"max_response_bytes":      &pc.MaxResponseBytes,
		"max_export_bytes":        &pc.MaxExportBytes,
	}
	secrets := map[string]*string{"token": &pc.Token, "accept_token": &pc.AcceptToken}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			if sub == "url" && !strings.Contains(pc.URL, "{") {
				if err := provider.ValidBaseURL(pc.URL); err != nil {
					return d.Errf("provider %s: url: %v", name, err)
				}
			}
			continue
		}
		if dst, ok := secrets[sub]; ok {
			if err := secretArg(d, "provider "+name, dst); err != nil {
				return err
			}
			continue
		}
		switch sub {
		case "domains":
			if err := domainsArg(d, "provider "+name, &pc.Domains); err != nil {
				return err
			}
		case "max_spaces":
			if err := maxSpacesArg(d, "provider "+name, &pc.MaxSpaces); err != nil {
				return err
			}
		case "trusted_ca_files":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			pc.TrustedCAFiles = append(pc.TrustedCAFiles, args...)
		default:
			return d.Errf("provider %s: unrecognized subdirective %s", name, sub)
		}
	}
	if err := required(d, "provider "+name, map[string]bool{"url": pc.URL != "", "token": pc.Token != "",
		"accept_token": pc.AcceptToken != "", "domains": len(pc.Domains) > 0}); err != nil {
		return err
	}
	a.Providers = append(a.Providers, pc)
	return nil
}

// unmarshalProviderClient reads a `provider_client <name> {...}` block of the lchat
// global option into a ProviderClientConfig, as unmarshalProvider does a provider.
func (a *App) unmarshalProviderClient(d *caddyfile.Dispenser) error {
	var name string
	if err := caddyfileutil.OneArg(d, &name); err != nil {
		return err
	}
	if err := registry.ValidateProviderName(name); err != nil {
		return d.Err(err.Error())
	}
	for _, o := range a.ProviderClients {
		if o != nil && o.Name == name {
			return d.Errf("provider_client %s given twice", name)
		}
	}
	cc := &ProviderClientConfig{Name: name}
	scalars := map[string]any{"max_export_bytes": &cc.MaxExportBytes}
	secrets := map[string]*string{"token": &cc.Token, "sign_token": &cc.SignToken}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if ok, err := scalarArg(d, scalars); ok {
			if err != nil {
				return err
			}
			continue
		}
		if dst, ok := secrets[sub]; ok {
			if err := secretArg(d, "provider_client "+name, dst); err != nil {
				return err
			}
			continue
		}
		switch sub {
		case "domains":
			if err := domainsArg(d, "provider_client "+name, &cc.Domains); err != nil {
				return err
			}
		case "max_spaces":
			if err := maxSpacesArg(d, "provider_client "+name, &cc.MaxSpaces); err != nil {
				return err
			}
		default:
			return d.Errf("provider_client %s: unrecognized subdirective %s", name, sub)
		}
	}
	if err := required(d, "provider_client "+name, map[string]bool{"token": cc.Token != "",
		"sign_token": cc.SignToken != "", "domains": len(cc.Domains) > 0}); err != nil {
		return err
	}
	a.ProviderClients = append(a.ProviderClients, cc)
	return nil
}

// secretArg reads a token of a provider block: one placeholder ({env.NAME},
// {file./path}), expanded in Provision, so that the adapted JSON (caddy adapt, the
// admin API's /config/) never holds the token. A literal, or a {$NAME} the Caddyfile
// substituted, is refused; the error never repeats the value.
func secretArg(d *caddyfile.Dispenser, block string, dst *string) error {
	sub := d.Val()
	if *dst != "" {
		return d.Errf("%s: %s given twice", block, sub)
	}
	var v string
	if err := caddyfileutil.OneArg(d, &v); err != nil {
		return err
	}
	if len(v) < 3 || v[0] != '{' || v[len(v)-1] != '}' || strings.Count(v, "{") != 1 {
		return d.Errf("%s: %s must be a placeholder such as {env.NAME} or {file./path/to/token} "+
			"(a literal token, or one substituted from {$NAME}, would be written into the adapted JSON)", block, sub)
	}
	*dst = v
	return nil
}

// domainsArg appends the domains of a provider block, each a hostname or a placeholder.
func domainsArg(d *caddyfile.Dispenser, block string, dst *[]string) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.ArgErr()
	}
	for _, v := range args {
		if strings.Contains(v, "{") {
			continue // checked once expanded, in Provision
		}
		if err := registry.ValidateHost(v); err != nil {
			return d.Errf("%s: domains: %v", block, err)
		}
	}
	*dst = append(*dst, args...)
	return nil
}

// maxSpacesArg reads a provider block's cap on spaces: 0 (no cap) or more.
func maxSpacesArg(d *caddyfile.Dispenser, block string, dst *int) error {
	var v string
	if err := caddyfileutil.OneArg(d, &v); err != nil {
		return err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return d.Errf("%s: max_spaces: want 0 (no cap) or a positive number, got %q", block, v)
	}
	*dst = n
	return nil
}

// required is an error naming, sorted, the subdirectives of block that set marks missing.
func required(d *caddyfile.Dispenser, block string, set map[string]bool) error {
	var missing []string
	for name, ok := range set {
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return d.Errf("%s: missing %s", block, strings.Join(missing, ", "))
}

// parseProviderAPI sets up the provider API (ProviderAPI) on a provider's site.
//
// Syntax:
//
//	lchat_provider_api
func parseProviderAPI(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h.Next()
	if h.NextArg() || h.NextBlock(0) {
		return nil, h.Errf("lchat_provider_api takes no arguments")
	}
	return new(ProviderAPI), nil
}

// parseHealth sets up the load balancer's health check (Health).
//
// Syntax:
//
//	lchat_health
func parseHealth(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h.Next()
	if h.NextArg() || h.NextBlock(0) {
		return nil, h.Errf("lchat_health takes no arguments")
	}
	return new(Health), nil
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
