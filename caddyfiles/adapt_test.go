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
	if got := dig(cfg, "apps", "lchat", "kinds", "demo", "command"); got != "{demo_space}" {
		t.Errorf("demo kind command = %v", got)
	}
	if got := dig(cfg, "apps", "lchat", "state_dir"); got != "/tmp/lchat-dev-test/state" {
		t.Errorf("state_dir = %v", got)
	}
	if got := dig(cfg, "apps", "lchat", "bucket", "backend"); got != "file" {
		t.Errorf("bucket backend = %v", got)
	}
	if got := dig(cfg, "admin", "listen"); got != "localhost:2019" {
		t.Errorf("admin listen = %v, want localhost:2019", got)
	}
	raw, _ := json.Marshal(dig(cfg, "apps", "http"))
	if !strings.Contains(string(raw), `"handler":"lchat"`) || !strings.Contains(string(raw), ":8080") {
		t.Errorf("http app lacks the lchat handler on :8080: %s", raw)
	}
}

// adaptErr adapts file and returns what the operator sees when adapting fails.
func adaptErr(t *testing.T, file string, env ...string) string {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), "adapt", "--config", filepath.Join(harness.RepoRoot(), "caddyfiles", file), "--adapter", "caddyfile")
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("adapting %s with %q succeeded:\n%s", file, env, out)
	}
	return string(out)
}

// policies returns the tls app's automation policies.
func policies(t *testing.T, cfg map[string]any) []any {
	t.Helper()
	ps, _ := dig(cfg, "apps", "tls", "automation", "policies").([]any)
	if len(ps) == 0 {
		t.Fatalf("no tls automation policies in %v", dig(cfg, "apps", "tls"))
	}
	return ps
}

// dnsProvider returns the DNS provider of the catch-all policy's only issuer, the one
// that covers the lchat app's wildcards.
func dnsProvider(t *testing.T, cfg map[string]any) map[string]any {
	t.Helper()
	var catchAll map[string]any
	for _, p := range policies(t, cfg) {
		if dig(p, "subjects") == nil {
			catchAll = p.(map[string]any)
		}
	}
	if catchAll == nil {
		t.Fatalf("no catch-all automation policy: %v", policies(t, cfg))
	}
	issuers, _ := catchAll["issuers"].([]any)
	if len(issuers) != 1 || dig(issuers[0], "module") != "acme" {
		t.Fatalf("catch-all policy issuers = %v, want one acme issuer", issuers)
	}
	prov, _ := dig(issuers[0], "challenges", "dns", "provider").(map[string]any)
	if prov == nil {
		t.Fatalf("the acme issuer has no DNS challenge: %v", issuers[0])
	}
	return prov
}

func TestAdaptSingle(t *testing.T) {
	secrets := []string{"LCHAT_HIBERNATE_BUCKET=must-not-appear-bucket", "LCHAT_DNSIMPLE_TOKEN=must-not-appear-token",
		"LCHAT_WILDCARD_DOMAINS=must-not-appear.example", "LCHAT_ROUTE53_ZONE_ID=must-not-appear-zone"}
	cfg := adapt(t, "single.Caddyfile", secrets...)
	raw, _ := json.Marshal(cfg)
	if strings.Contains(string(raw), "must-not-appear") {
		t.Errorf("an environment value was expanded at adapt time; it must stay an {env.*} placeholder: %s", raw)
	}
	if got := dig(cfg, "apps", "lchat", "bucket", "backend"); got != "s3" {
		t.Errorf("bucket backend = %v", got)
	}
	// The admin API (routes with their env, pins, config) is a Unix socket only the
	// box's user may open: spaces run under other uids on the same machine.
	if got := dig(cfg, "admin", "listen"); got != "unix//run/lchat-caddy/admin.sock|0600" {
		t.Errorf("admin listen = %v, want unix//run/lchat-caddy/admin.sock|0600", got)
	}
	if got := dig(cfg, "apps", "lchat", "kinds", "demo", "idle_timeout"); got == nil {
		t.Errorf("demo kind missing: %s", raw)
	}
	// The wildcards come from the environment when the config loads.
	if got, _ := json.Marshal(dig(cfg, "apps", "lchat", "wildcard_domains")); string(got) != `["{env.LCHAT_WILDCARD_DOMAINS}"]` {
		t.Errorf("wildcard_domains = %s", got)
	}
	// One catch-all HTTPS site runs the lchat handler for every host.
	srv := dig(cfg, "apps", "http", "servers", "srv0")
	if l, _ := json.Marshal(dig(srv, "listen")); string(l) != `[":443"]` {
		t.Errorf("srv0 listens on %s, want :443", l)
	}
	routes, _ := json.Marshal(dig(srv, "routes"))
	if string(routes) != `[{"handle":[{"handler":"lchat"}]}]` {
		t.Errorf("srv0 routes = %s, want only the lchat handler with no host matcher", routes)
	}
	// Defaults: dnsimple with the token from the environment, certificates on local disk.
	prov := dnsProvider(t, cfg)
	if prov["name"] != "dnsimple" || prov["api_access_token"] != "{env.LCHAT_DNSIMPLE_TOKEN}" {
		t.Errorf("default DNS provider = %v, want dnsimple with {env.LCHAT_DNSIMPLE_TOKEN}", prov)
	}
	if got := dig(cfg, "storage"); dig(got, "module") != "file_system" || dig(got, "root") != "/var/lib/lchat-caddy/caddy" {
		t.Errorf("default storage = %v, want file_system under /var/lib/lchat-caddy", got)
	}
}

func TestAdaptSingleRoute53(t *testing.T) {
	cfg := adapt(t, "single.Caddyfile", "LCHAT_DNS_PROVIDER=route53", "LCHAT_ROUTE53_ZONE_ID=must-not-appear-zone")
	prov := dnsProvider(t, cfg)
	want := map[string]any{"name": "route53", "hosted_zone_id": "{env.LCHAT_ROUTE53_ZONE_ID}"}
	if len(prov) != len(want) || prov["name"] != want["name"] || prov["hosted_zone_id"] != want["hosted_zone_id"] {
		t.Errorf("route53 provider = %v, want %v (credentials from the AWS chain, nothing else)", prov, want)
	}
}

func TestAdaptSingleCertCacheS3(t *testing.T) {
	cfg := adapt(t, "single.Caddyfile", "LCHAT_CERT_CACHE=s3", "LCHAT_HIBERNATE_BUCKET=must-not-appear")
	got, _ := json.Marshal(dig(cfg, "storage"))
	want := `{"bucket":{"backend":"s3","bucket":"{env.LCHAT_HIBERNATE_BUCKET}","prefix":"{env.LCHAT_HIBERNATE_PREFIX}"},"module":"lchat"}`
	if string(got) != want {
		t.Errorf("storage = %s, want %s", got, want)
	}
}

// Overrides of paths and listeners an operator (or a test) may need.
func TestAdaptSingleOverrides(t *testing.T) {
	cfg := adapt(t, "single.Caddyfile", "LCHAT_STATE_DIR=/srv/lchat", "LCHAT_HTTPS_PORT=8443", "LCHAT_HTTP_PORT=8080",
		"LCHAT_ADMIN_LISTEN=127.0.0.1:2999")
	for _, c := range []struct {
		path []string
		want any
	}{
		{[]string{"apps", "lchat", "state_dir"}, "/srv/lchat/spaces"},
		{[]string{"apps", "lchat", "registry"}, "/srv/lchat/registry.db"},
		{[]string{"storage", "root"}, "/srv/lchat/caddy"},
		{[]string{"apps", "http", "https_port"}, 8443.0},
		{[]string{"apps", "http", "http_port"}, 8080.0},
		{[]string{"admin", "listen"}, "127.0.0.1:2999"},
	} {
		if got := dig(cfg, c.path...); got != c.want {
			t.Errorf("%s = %v, want %v", strings.Join(c.path, "."), got, c.want)
		}
	}
}

// A provider or cache that is not shipped stops the adapter with a message that
// names the snippet file it looked for.
func TestAdaptSingleUnknownChoice(t *testing.T) {
	if out := adaptErr(t, "single.Caddyfile", "LCHAT_DNS_PROVIDER=cloudflare"); !strings.Contains(out, "File to import not found: dns-cloudflare.caddy") {
		t.Errorf("unknown DNS provider: %s", out)
	}
	if out := adaptErr(t, "single.Caddyfile", "LCHAT_CERT_CACHE=redis"); !strings.Contains(out, "File to import not found: cert-cache-redis.caddy") {
		t.Errorf("unknown certificate cache: %s", out)
	}
}

// The mesh box uses the same snippets as the single box: wildcards from the lchat
// app, one catch-all site with the DNS-01 policy, and the peer API on the SELF site
// only, whose own certificate keeps Caddy's default issuers.
func TestAdaptMesh(t *testing.T) {
	cfg := adapt(t, "mesh.Caddyfile", "LCHAT_MESH_SELF=https://box-1.example.net", "LCHAT_CERT_CACHE=s3",
		"LCHAT_MESH_TOKEN=must-not-appear", "LCHAT_WILDCARD_DOMAINS=must-not-appear.example")
	raw, _ := json.Marshal(cfg)
	if strings.Contains(string(raw), "must-not-appear") {
		t.Errorf("an environment value was expanded at adapt time: %s", raw)
	}
	if got, _ := json.Marshal(dig(cfg, "apps", "lchat", "wildcard_domains")); string(got) != `["{env.LCHAT_WILDCARD_DOMAINS}"]` {
		t.Errorf("wildcard_domains = %s", got)
	}
	if prov := dnsProvider(t, cfg); prov["name"] != "dnsimple" {
		t.Errorf("default DNS provider = %v, want dnsimple", prov)
	}
	if got := dig(cfg, "storage", "module"); got != "lchat" {
		t.Errorf("LCHAT_CERT_CACHE=s3: storage module = %v, want lchat", got)
	}
	if got := dig(cfg, "admin", "listen"); got != "unix//run/lchat-caddy/admin.sock|0600" {
		t.Errorf("admin listen = %v, want unix//run/lchat-caddy/admin.sock|0600", got)
	}
	var selfPolicy bool
	for _, p := range policies(t, cfg) {
		if s, _ := json.Marshal(dig(p, "subjects")); string(s) == `["box-1.example.net"]` && dig(p, "issuers") == nil {
			selfPolicy = true
		}
	}
	if !selfPolicy {
		t.Errorf("the SELF name has no policy of its own with the default issuers: %v", policies(t, cfg))
	}
}
