//go:build tools

// Package deps pins modules that later packages import, so go mod tidy keeps them.
package deps

import (
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	_ "github.com/aws/aws-sdk-go-v2/service/s3"
	_ "github.com/coder/websocket"
	_ "github.com/libdns/dnsimple"
	_ "github.com/libdns/route53"
	_ "go.etcd.io/bbolt"
	_ "modernc.org/sqlite"
	_ "tailscale.com/derp/derphttp"
	_ "tailscale.com/derp/derpserver"
)
