// Package caddyfiles holds the shipped Caddyfiles; this test adapts each one with the
// real lchat-caddy binary and checks the JSON an operator relies on.
package caddyfiles

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

func adapt(t *testing.T, file string, env ...string) map[string]any {
	t.Helper()
	bin := harness.Binary(t)
	cmd := exec.Command(bin, "adapt", "--config", filepath.Join(harness.RepoRoot(), "caddyfiles", file), "--adapter", "caddyfile")
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("adapting %s: %v\n%s", file, err, stderr)
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("adapted %s is not JSON: %v\n%s", file, err, out)
	}
	return cfg
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func TestAdaptDev(t *testing.T) {
	cfg := adapt(t, "dev.Caddyfile", "LCHAT_DEV_DIR=/tmp/lchat-dev-test")
	if got := dig(cfg, "apps", "lchat", "kinds", "demo", "command"); got != "{self}" {
		t.Errorf("demo kind command = %v", got)
	}
	if got := dig(cfg, "apps", "lchat", "state_dir"); got != "/tmp/lchat-dev-test/state" {
		t.Errorf("state_dir = %v", got)
	}
	if got := dig(cfg, "apps", "lchat", "bucket", "backend"); got != "file" {
		t.Errorf("bucket backend = %v", got)
	}
	raw, _ := json.Marshal(dig(cfg, "apps", "http"))
	if !strings.Contains(string(raw), `"handler":"lchat"`) || !strings.Contains(string(raw), ":8080") {
		t.Errorf("http app lacks the lchat handler on :8080: %s", raw)
	}
}

func TestAdaptSingle(t *testing.T) {
	cfg := adapt(t, "single.Caddyfile", "LCHAT_WILDCARD_DOMAINS=example.com", "LCHAT_DNS_PROVIDER=route53",
		"LCHAT_HIBERNATE_BUCKET=must-not-appear-in-json")
	raw, _ := json.Marshal(cfg)
	if strings.Contains(string(raw), "must-not-appear-in-json") {
		t.Errorf("bucket name expanded at adapt time; it must stay an {env.*} placeholder: %s", raw)
	}
	if got := dig(cfg, "apps", "lchat", "bucket", "backend"); got != "s3" {
		t.Errorf("bucket backend = %v", got)
	}
	if !strings.Contains(string(raw), `*.example.com`) || !strings.Contains(string(raw), `"handler":"lchat"`) {
		t.Errorf("site *.example.com with the lchat handler missing: %s", raw)
	}
	if got := dig(cfg, "apps", "lchat", "kinds", "demo", "idle_timeout"); got == nil {
		t.Errorf("demo kind missing: %s", raw)
	}
}
