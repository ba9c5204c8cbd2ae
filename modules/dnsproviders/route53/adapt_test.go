package route53

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
	acme_dns route53 {
		hosted_zone_id {env.LCHAT_ROUTE53_ZONE}
		region eu-west-1
	}
}
*.mesh.test {
	tls {
		dns route53 Z456
	}
	respond "ok"
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"provider":{"hosted_zone_id":"{env.LCHAT_ROUTE53_ZONE}","name":"route53","region":"eu-west-1"}`,
		`"provider":{"hosted_zone_id":"Z456","name":"route53"}`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, out)
		}
	}
}
