package route53

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
)

func FuzzCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds,
		"route53 Z123",
		"route53 {\n\thosted_zone_id Z1\n\tregion us-east-1\n\tprofile p\n\taccess_key_id a\n\tsecret_access_key s\n\tsession_token t\n\tmax_retries 3\n\twait_for_sync\n\tmax_wait 2m\n}",
		"route53 {\n\tmax_retries -1\n}", "route53 {\n\tmax_wait forever\n}", "route53 a b",
	) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *Provider { return new(Provider) })
	})
}
