package dnsimple

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
)

func FuzzCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds,
		"dnsimple TOKEN",
		"dnsimple {\n\tapi_access_token T\n\taccount_id 1234\n\tapi_url https://api.sandbox.dnsimple.com\n}",
		"dnsimple a b", "dnsimple {\n\tapi_url\n}",
	) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *Provider { return new(Provider) })
	})
}
