package derpswitch

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
)

func FuzzCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds,
		"derp_switch {\n\tderp_map_file /etc/lchat/derp.json\n\thome_region 2\n\tmode legacy\n\tprove {\n\t\tcount 5\n\t\ttimeout 1s\n\t\tinterval 50ms\n\t}\n\tretry_backoff 5s 15s 1m\n\tdrain 10s\n}",
		"derp_switch {\n\tautonegotiate {\n\t\tstability_window 2m\n\t\tdwell 5m\n\t\tmax_switches_per_hour 4\n\t\tban 10m\n\t}\n\techo_prefix off\n}",
		"derp_switch {\n\tderp_map `{\"Regions\":{}}`\n}", "derp_switch {\n\thome_region -3\n}", "derp_switch {\n\tmode warp\n}",
		"derp_switch {\n\tretry_backoff\n}", "derp_switch {\n\tstorage file_system /tmp/x\n}",
	) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *App { return new(App) })
	})
}
