package certstorage

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/lchat/lchat-caddy/modules/buckets"
)

// The snippet the shipped Caddyfiles use for LCHAT_CERT_CACHE=s3 adapts to the
// storage module with the bucket guest module inline.
func TestAdaptCaddyfile(t *testing.T) {
	input := `{
	storage lchat {
		bucket s3 {env.LCHAT_HIBERNATE_BUCKET} {
			prefix {env.LCHAT_HIBERNATE_PREFIX}
		}
		lock_ttl 90s
	}
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `"storage":{"bucket":{"backend":"s3","bucket":"{env.LCHAT_HIBERNATE_BUCKET}","prefix":"{env.LCHAT_HIBERNATE_PREFIX}"},"lock_ttl":90000000000,"module":"lchat"}`
	if !strings.Contains(string(out), want) {
		t.Fatalf("adapted JSON lacks %s:\n%s", want, out)
	}
}
