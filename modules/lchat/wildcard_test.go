package lchat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"

	_ "github.com/lchat/lchat-caddy/modules/buckets"
	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/testdns"
)

func TestWildcardDomainsCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`lchat {
		wildcard_domains mesh.test
		wildcard_domains {env.LCHAT_WILDCARD_DOMAINS} other.test
	}`)
	var a App
	if err := a.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	want := []string{"mesh.test", "{env.LCHAT_WILDCARD_DOMAINS}", "other.test"}
	if !slices.Equal(a.WildcardDomains, want) {
		t.Fatalf("WildcardDomains = %q, want %q", a.WildcardDomains, want)
	}
	if err := new(App).UnmarshalCaddyfile(caddyfile.NewTestDispenser("lchat {\n wildcard_domains\n}")); err == nil {
		t.Fatal("wildcard_domains without a domain parsed")
	}
}

// Issuers for the tls app configs below.
var (
	dnsIssuer  = map[string]any{"module": "acme", "challenges": map[string]any{"dns": map[string]any{"provider": map[string]any{"name": "lchat_challtestsrv", "management_url": "http://127.0.0.1:1"}}}}
	httpIssuer = map[string]any{"module": "acme"}
)

func policy(subjects []string, issuers ...any) map[string]any {
	p := map[string]any{"issuers": issuers}
	if subjects != nil {
		p["subjects"] = subjects
	}
	return p
}

// validateWildcards provisions (without starting) a config with the lchat app, its
// wildcard_domains, and a tls app with the given automation policies (none: no tls
// app), the way `lchat-caddy run` would.
func validateWildcards(t *testing.T, domains []string, policies ...any) error {
	t.Helper()
	// Short: the state dir holds Unix sockets.
	dir, err := os.MkdirTemp("", "lw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	lchatApp := map[string]any{
		"bucket":    map[string]any{"backend": "file", "root": filepath.Join(dir, "bucket")},
		"state_dir": filepath.Join(dir, "state"),
		"registry":  filepath.Join(dir, "registry.db"),
	}
	if domains != nil {
		lchatApp["wildcard_domains"] = domains
	}
	apps := map[string]any{"lchat": lchatApp}
	if policies != nil {
		apps["tls"] = map[string]any{"automation": map[string]any{"policies": policies}}
	}
	raw, err := json.Marshal(map[string]any{
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(dir, "caddy")},
		"apps":    apps,
	})
	if err != nil {
		t.Fatal(err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&cfg)
}

// A box refuses to start when it could not obtain a wildcard it was asked for, and
// names the domain and the fix; it starts when a DNS-01 policy covers every one.
func TestWildcardDomainsNeedDNSChallenge(t *testing.T) {
	t.Setenv("LCHAT_WILDCARD_DOMAINS", "")
	catchAllDNS := policy(nil, dnsIssuer)
	for _, tc := range []struct {
		name     string
		env      string
		domains  []string
		policies []any
		wantErr  []string // substrings; none means success
	}{
		{name: "catch-all DNS-01 policy", domains: []string{"mesh.test", "other.test"}, policies: []any{catchAllDNS}},
		{name: "from LCHAT_WILDCARD_DOMAINS", env: "mesh.test,other.test", policies: []any{catchAllDNS}},
		{name: "a policy per domain", domains: []string{"mesh.test other.test"},
			policies: []any{policy([]string{"*.mesh.test"}, dnsIssuer), policy([]string{"*.other.test"}, dnsIssuer), policy(nil, httpIssuer)}},
		{name: "internal issuer", domains: []string{"mesh.test"}, policies: []any{policy(nil, map[string]any{"module": "internal"})}},
		{name: "none configured, none in the environment"},
		{name: "no tls app", domains: []string{"mesh.test"},
			wantErr: []string{"*.mesh.test", "no TLS automation policy covers it", "acme_dns"}},
		{name: "HTTP challenge only", env: "mesh.test",
			policies: []any{policy(nil, httpIssuer)},
			wantErr:  []string{"*.mesh.test", "no issuer with a DNS challenge", "tls { dns"}},
		{name: "one domain not covered", domains: []string{"mesh.test", "other.test"},
			policies: []any{policy([]string{"*.mesh.test"}, dnsIssuer), policy(nil, httpIssuer)},
			wantErr:  []string{"*.other.test"}},
		{name: "explicit but empty", domains: []string{"{env.LCHAT_WILDCARD_DOMAINS}"}, policies: []any{catchAllDNS},
			wantErr: []string{"names no domain", "{env.LCHAT_WILDCARD_DOMAINS}"}},
		{name: "bad value in the environment", env: "https://mesh.test", policies: []any{catchAllDNS},
			wantErr: []string{"LCHAT_WILDCARD_DOMAINS", "is not a domain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("LCHAT_WILDCARD_DOMAINS", tc.env)
			err := validateWildcards(t, tc.domains, tc.policies...)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("config refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("config accepted")
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q: %v", s, err)
				}
			}
		})
	}
}
