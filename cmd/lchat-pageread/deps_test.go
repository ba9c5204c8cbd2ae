package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStaysSmall: the helper starts per database per checkpoint (and per awake space for
// the log), so it must not grow into the box: no Caddy, and of this module only the page
// reader.
func TestStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		if strings.Contains(d, "caddyserver") || strings.Contains(d, "certmagic") || strings.Contains(d, "aws-sdk") ||
			(strings.HasPrefix(d, "github.com/lchat/lchat-caddy/") && d != "github.com/lchat/lchat-caddy/spacestore/pageread" &&
				d != "github.com/lchat/lchat-caddy/cmd/lchat-pageread") {
			t.Errorf("lchat-pageread imports %s", d)
		}
	}
	if len(deps) > 200 {
		t.Errorf("lchat-pageread has %d dependencies, more than the 200 it should ever need (141 when written)", len(deps))
	}
	t.Logf("%d packages", len(deps))
}
