// Command lchat-caddy is Caddy with the standard modules and every lchat module built in.
package main

import (
	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/lchat/lchat-caddy"
)

func main() {
	// Usage lines and help name the command people type.
	caddy.CustomBinaryName = "lchat-caddy"
	caddy.CustomLongDescription = `lchat-caddy is Caddy with the lchat modules built in: an edge proxy for a
fleet of hibernating spaces (wake on request, sleep when idle, state in S3),
several boxes sharing one bucket without a coordinator, and make-before-break
DERP region switching.

Start here:

	lchat-caddy dev                      a local box with a demo space and the console
	lchat-caddy run --config Caddyfile   a real box (see caddyfiles/ and the README)
	lchat-caddy add-instance <host> --kind <kind>
	lchat-caddy fleet
`
	caddycmd.Main()
}
