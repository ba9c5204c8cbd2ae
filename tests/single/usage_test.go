package single

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestUsageLinesNameTheBinary: every subcommand's usage line starts with lchat-caddy, the
// command people type, not caddy.
func TestUsageLinesNameTheBinary(t *testing.T) {
	bin := harness.Binary(t)
	for _, sub := range []string{"dev", "add-instance", "remove", "routes", "hibernate", "fleet", "mesh-seed",
		"relocate", "next-id", "seed-ids", "bucket-check", "demo-space", "history", "restore", "run"} {
		out, err := exec.Command(bin, "help", sub).CombinedOutput()
		if err != nil {
			t.Errorf("help %s: %v\n%s", sub, err, out)
			continue
		}
		_, usage, ok := strings.Cut(string(out), "Usage:\n")
		if !ok || !strings.HasPrefix(strings.TrimSpace(usage), "lchat-caddy "+sub) {
			t.Errorf("help %s usage line: %.120q, want it to start with \"lchat-caddy %s\"", sub, usage, sub)
		}
	}
}
