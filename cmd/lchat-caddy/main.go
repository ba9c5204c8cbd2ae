// Command lchat-caddy is Caddy with the standard modules and every lchat module built in.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/lchat/lchat-caddy"
)

func main() {
	caddycmd.Main()
}
