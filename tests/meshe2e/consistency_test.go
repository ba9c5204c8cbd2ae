package meshe2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestContradictoryConfigRefused: a mesh config whose parts contradict each other stops
// start-up with a message saying which (mesh domains no managed wildcard covers with an
// https SELF, a public_address that is not an IP, a relocate_dns zone holding none of
// the mesh domains); one that only looks wrong (a plain-http SELF on a public address)
// starts with a warning, and one on a private address without it.
func TestContradictoryConfigRefused(t *testing.T) {
	bin := harness.Binary(t)
	const token = "consistency-token-never-printed-4b8e1d7f"
	config := func(t *testing.T, meshOpts map[string]any) string {
		dir := t.TempDir()
		cfg := map[string]any{
			"admin": map[string]any{"disabled": true},
			"apps": map[string]any{
				"lchat": map[string]any{
					"bucket":           map[string]any{"backend": "file", "root": filepath.Join(dir, "bucket")},
					"state_dir":        filepath.Join(dir, "st"),
					"registry":         filepath.Join(dir, "reg.db"),
					"wildcard_domains": []string{"example.com"},
					"mesh":             meshOpts,
				},
				// The internal CA issues wildcards without a DNS challenge.
				"tls": map[string]any{"automation": map[string]any{"policies": []any{map[string]any{"issuers": []any{map[string]any{"module": "internal"}}}}}},
			},
		}
		raw, _ := json.Marshal(cfg)
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(t *testing.T, sub, cfgFile string, env ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		dir := filepath.Dir(cfgFile)
		cmd := exec.CommandContext(ctx, bin, sub, "--config", cfgFile)
		cmd.Env = append([]string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "PATH=" + os.Getenv("PATH"),
			mesh.EnvToken + "=" + token}, env...)
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("%s still running after a minute", sub)
		}
		if strings.Contains(string(out), token) {
			t.Errorf("output prints the token:\n%s", out)
		}
		return string(out), err
	}
	dnsimple := map[string]any{"provider": map[string]any{"name": "dnsimple", "api_access_token": "x"}}
	for _, tc := range []struct {
		name, self, domains string
		meshOpts            map[string]any
		want                string
	}{
		{"mesh domain without a wildcard", "https://box-1.example.net", "example.com,example.org", map[string]any{}, "example.org are not among the wildcard domains"},
		{"public_address not an IP", "https://box-1.example.net", "example.com", map[string]any{"public_address": "box-1.example.net"}, "not an IP address"},
		{"zone holding no mesh domain", "https://box-1.example.net", "example.com", map[string]any{"relocate_dns": merge(dnsimple, map[string]any{"zone": "example.net"})}, "contains none of the mesh domains"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, "run", config(t, tc.meshOpts), mesh.EnvSelf+"="+tc.self, mesh.EnvDomains+"="+tc.domains)
			if err == nil {
				t.Fatalf("started; want a refusal:\n%s", out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("refusal does not say %q:\n%s", tc.want, out)
			}
		})
	}
	t.Run("plain http SELF", func(t *testing.T) {
		// The zone defaults to the first wildcard domain.
		cfg := config(t, map[string]any{"relocate_dns": dnsimple, "public_address": "{env.LCHAT_PUBLIC_ADDRESS}"})
		const warning = "plain http on an address that is not private"
		out, err := run(t, "validate", cfg, mesh.EnvSelf+"=http://203.0.113.9", mesh.EnvDomains+"=example.com", "LCHAT_PUBLIC_ADDRESS=203.0.113.9")
		if err != nil || !strings.Contains(out, warning) {
			t.Fatalf("public plain-http SELF: err %v; want a valid config with the warning:\n%s", err, out)
		}
		out, err = run(t, "validate", cfg, mesh.EnvSelf+"=http://10.0.0.5", mesh.EnvDomains+"=example.com")
		if err != nil || strings.Contains(out, warning) {
			t.Fatalf("private plain-http SELF (and no LCHAT_PUBLIC_ADDRESS): err %v; want valid without the warning:\n%s", err, out)
		}
	})
}

func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
