// Command cmd is the lchat-caddy build the certificate end-to-end tests run: the shipped
// binary (Caddy's standard modules and every lchat module) plus the test-only
// challtestsrv DNS provider that the shipped binary leaves out.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/lchat/lchat-caddy"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/testdns"
)

func main() {
	caddycmd.Main()
}
