package caddyfiles

import (
	"testing"
	"time"
)

// TestShippedCaddyfilesBoundShutdown: every shipped Caddyfile sets a bounded grace
// period. Without one Caddy waits for open streams forever on shutdown (an eternal grace
// period), and one open browser tab turns a deploy into systemd's SIGKILL.
func TestShippedCaddyfilesBoundShutdown(t *testing.T) {
	for _, tc := range []struct {
		file string
		env  []string
	}{
		{"dev.Caddyfile", []string{"LCHAT_DEV_DIR=/tmp/lchat-dev-test"}},
		{"single.Caddyfile", nil},
		{"mesh.Caddyfile", []string{"LCHAT_MESH_SELF=https://box-a.example.net"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cfg := adapt(t, tc.file, tc.env...)
			raw := dig(cfg, "apps", "http", "grace_period")
			var d time.Duration
			switch v := raw.(type) {
			case float64:
				d = time.Duration(v)
			case string:
				d, _ = time.ParseDuration(v)
			}
			if d <= 0 || d > 30*time.Second {
				t.Fatalf("apps.http.grace_period = %v, want a bound within 30s", raw)
			}
		})
	}
}
