package derpswitch

import (
	"encoding/json"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("derp_switch", parseGlobalOption)
}

// parseGlobalOption parses the `derp_switch` global option; repeated blocks merge.
func parseGlobalOption(d *caddyfile.Dispenser, existingVal any) (any, error) {
	app := new(App)
	if existingVal != nil {
		prev, ok := existingVal.(httpcaddyfile.App)
		if !ok {
			return nil, d.Errf("existing derp_switch value of unexpected type %T", existingVal)
		}
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, d.Errf("merging derp_switch blocks: %v", err)
		}
	}
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "derp_switch", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from Caddyfile tokens. Syntax:
//
//	derp_switch {
//		derp_map_file <path>
//		derp_map <inline JSON>
//		home_region <id>
//		mode mbb|legacy
//		prove {
//			count <n>
//			timeout <duration>
//			interval <duration>
//			connect_timeout <duration>
//		}
//		retry_backoff <duration>...
//		drain <duration>
//		negotiate_interval <duration>
//		autonegotiate {
//			interval <duration>
//			stability_window <duration>
//			dwell <duration>
//			max_switches_per_hour <n>
//			ban <duration>
//			history <duration>
//		}
//		echo_prefix <prefix>|off
//		echo_reply_prefix <prefix>
//		storage <module> ...   # node key and pin; default: Caddy's storage unless shared
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "derp_map_file":
			v, err := stringArg(d)
			if err != nil {
				return err
			}
			a.DERPMapFile = v
		case "derp_map":
			v, err := stringArg(d)
			if err != nil {
				return err
			}
			if !json.Valid([]byte(v)) {
				return d.Errf("derp_map: invalid JSON")
			}
			a.DERPMap = json.RawMessage(v)
		case "home_region":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			a.HomeRegion = n
		case "mode":
			v, err := stringArg(d)
			if err != nil {
				return err
			}
			if v != "mbb" && v != "legacy" {
				return d.Errf("mode must be mbb or legacy, not %q", v)
			}
			a.Mode = v
		case "prove":
			if a.Prove == nil {
				a.Prove = new(ProveConfig)
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				var err error
				switch d.Val() {
				case "count":
					a.Prove.Count, err = intArg(d)
				case "timeout":
					a.Prove.Timeout, err = durationArg(d)
				case "interval":
					a.Prove.Interval, err = durationArg(d)
				case "connect_timeout":
					a.Prove.ConnectTimeout, err = durationArg(d)
				default:
					return d.Errf("unrecognized prove subdirective %s", d.Val())
				}
				if err != nil {
					return err
				}
			}
		case "retry_backoff":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.RetryBackoff = nil
			for _, s := range args {
				dur, err := caddy.ParseDuration(s)
				if err != nil {
					return d.Errf("retry_backoff %q: %v", s, err)
				}
				a.RetryBackoff = append(a.RetryBackoff, caddy.Duration(dur))
			}
		case "drain":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			a.Drain = dur
		case "negotiate_interval":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			a.NegotiateInterval = dur
		case "autonegotiate":
			if a.Autonegotiate == nil {
				a.Autonegotiate = new(AutonegConfig)
			}
			an := a.Autonegotiate
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				var err error
				switch d.Val() {
				case "interval":
					an.Interval, err = durationArg(d)
				case "stability_window":
					an.StabilityWindow, err = durationArg(d)
				case "dwell":
					an.Dwell, err = durationArg(d)
				case "max_switches_per_hour":
					an.MaxSwitchesPerHour, err = intArg(d)
				case "ban":
					an.Ban, err = durationArg(d)
				case "history":
					an.History, err = durationArg(d)
				default:
					return d.Errf("unrecognized autonegotiate subdirective %s", d.Val())
				}
				if err != nil {
					return err
				}
			}
		case "echo_prefix":
			v, err := stringArg(d)
			if err != nil {
				return err
			}
			a.EchoPrefix = v
		case "echo_reply_prefix":
			v, err := stringArg(d)
			if err != nil {
				return err
			}
			a.EchoReplyPrefix = v
		case "storage":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			unm, err := caddyfile.UnmarshalModule(d, "caddy.storage."+name)
			if err != nil {
				return err
			}
			if _, ok := unm.(caddy.StorageConverter); !ok {
				return d.Errf("storage: module %s is not a storage", name)
			}
			a.StorageRaw = caddyconfig.JSONModuleObject(unm, "module", name, nil)
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// stringArg reads exactly one argument.
func stringArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

// intArg reads exactly one integer argument.
func intArg(d *caddyfile.Dispenser) (int, error) {
	v, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s: %v", v, err)
	}
	return n, nil
}

// durationArg reads exactly one duration argument.
func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	v, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("duration %q: %v", v, err)
	}
	return caddy.Duration(dur), nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
)
