package testdns

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
)

func FuzzCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds, "lchat_challtestsrv http://127.0.0.1:8055", "lchat_challtestsrv {\n\tmanagement_url http://x\n}", "lchat_challtestsrv a b") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *Provider { return new(Provider) })
	})
}
