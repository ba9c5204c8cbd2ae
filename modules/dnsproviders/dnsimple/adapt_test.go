package dnsimple

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// The provider as the shipped Caddyfiles use it: the global acme_dns option and a
// site's tls dns directive both adapt to the same module JSON.
func TestAdaptCaddyfile(t *testing.T) {
	input := `{
	acme_dns dnsimple {env.DNSIMPLE_API_TOKEN}
}
*.mesh.test {
	tls {
		dns dnsimple {
			api_access_token {env.DNSIMPLE_API_TOKEN}
			account_id 1010
		}
	}
	respond "ok"
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"provider":{"api_access_token":"{env.DNSIMPLE_API_TOKEN}","name":"dnsimple"}`,
		`"provider":{"account_id":"1010","api_access_token":"{env.DNSIMPLE_API_TOKEN}","name":"dnsimple"}`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, out)
		}
	}
}
