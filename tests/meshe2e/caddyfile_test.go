package meshe2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestAdaptMeshCaddyfile: the shipped mesh Caddyfile mounts the peer API on the SELF
// site only, the lchat handler on the catch-all site that serves every space, keeps the mesh token out of the
// adapted JSON, and sets the mesh intervals.
func TestAdaptMeshCaddyfile(t *testing.T) {
	cmd := exec.Command(harness.Binary(t), "adapt", "--config", filepath.Join(harness.RepoRoot(), "caddyfiles", "mesh.Caddyfile"))
	cmd.Env = append(cmd.Environ(), "LCHAT_WILDCARD_DOMAINS=example.com", "LCHAT_MESH_SELF=https://box-1.example.net",
		"LCHAT_MESH_TOKEN=must-not-appear", "LCHAT_HIBERNATE_BUCKET=must-not-appear-either")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if strings.Contains(string(out), "must-not-appear") {
		t.Errorf("adapted JSON holds an env value: %s", out)
	}
	var cfg struct {
		Apps struct {
			Lchat struct {
				Mesh map[string]any `json:"mesh"`
			} `json:"lchat"`
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Match []struct {
							Host []string `json:"host"`
						} `json:"match"`
						Handle []json.RawMessage `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Apps.Lchat.Mesh["beat"] == nil || cfg.Apps.Lchat.Mesh["dead_after"] == nil {
		t.Errorf("mesh intervals missing: %v", cfg.Apps.Lchat.Mesh)
	}
	found := map[string]string{}
	for _, srv := range cfg.Apps.HTTP.Servers {
		for _, r := range srv.Routes {
			h, _ := json.Marshal(r.Handle)
			if len(r.Match) == 0 {
				found["(catch-all)"] += string(h)
				continue
			}
			found[strings.Join(r.Match[0].Host, ",")] += string(h)
		}
	}
	if s := found["box-1.example.net"]; !strings.Contains(s, `"lchat_mesh_api"`) || strings.Contains(s, `"handler":"lchat"`) {
		t.Errorf("SELF site = %s, want the peer API and no lchat handler", s)
	}
	if s := found["(catch-all)"]; !strings.Contains(s, `"handler":"lchat"`) || strings.Contains(s, "lchat_mesh_api") {
		t.Errorf("catch-all site = %s, want the lchat handler and no peer API (sites: %v)", s, found)
	}
}
