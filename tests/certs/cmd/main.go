// Command cmd is the lchat-caddy build the certificate end-to-end tests run: Caddy's
// standard modules, the bucket modules, the certificate storage, the DNS providers, and the test-only
// challtestsrv provider that the shipped binary leaves out.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/lchat/lchat-caddy/modules/buckets"
	_ "github.com/lchat/lchat-caddy/modules/certstorage"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/dnsimple"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/route53"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/testdns"
)

func main() {
	caddycmd.Main()
}
