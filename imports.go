// Package lchatcaddy blank-imports every lchat-caddy module, so that
// `xcaddy build --with github.com/lchat/lchat-caddy` gets all of them.
package lchatcaddy

import (
	_ "github.com/lchat/lchat-caddy/modules/buckets"
	_ "github.com/lchat/lchat-caddy/modules/certstorage"
	_ "github.com/lchat/lchat-caddy/modules/console"
	_ "github.com/lchat/lchat-caddy/modules/demospacecmd"
	_ "github.com/lchat/lchat-caddy/modules/derpswitch"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/dnsimple"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/route53"
	_ "github.com/lchat/lchat-caddy/modules/lchat"
	_ "github.com/lchat/lchat-caddy/modules/lchatcli"
	_ "github.com/lchat/lchat-caddy/modules/proxyprotocol"
)
