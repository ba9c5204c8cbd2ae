package certstorage

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
	_ "github.com/lchat/lchat-caddy/modules/buckets" // the bucket blocks' modules
)

func FuzzCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds,
		"lchat {\n\tbucket file /var/lib/b\n\tprefix certs\n\tlock_ttl 2m\n\tlock_refresh 30s\n\tlock_poll 1s\n}",
		"lchat {\n\tbucket s3 {\n\t\tbucket b\n\t\tregion r\n\t}\n}",
		"lchat {\n\tbucket nosuch x\n}", "lchat {\n\tlock_ttl -1s\n}", "lchat {\n\tlock_ttl soon\n}", "lchat x",
	) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *Module { return new(Module) })
	})
}
