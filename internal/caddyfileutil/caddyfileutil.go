// Package caddyfileutil holds the small Caddyfile parsing helpers our modules share.
package caddyfileutil

import "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

// OneArg reads exactly one argument of the current directive into dst: a missing or an
// extra argument is d.ArgErr().
func OneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}
