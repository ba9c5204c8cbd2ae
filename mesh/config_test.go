package mesh

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testToken = "s3cr3t-TOKEN-value-9f8e7d-0a1b2c3d4e"

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Config
		errHas  string // the variable the error must name
		enabled bool
	}{
		{name: "mesh off", env: map[string]string{EnvDomains: "example.com", EnvToken: testToken}},
		{name: "blank self is off", env: map[string]string{EnvSelf: "  "}},
		{
			name: "full", enabled: true,
			env:  map[string]string{EnvSelf: "HTTPS://Box-1.Example.NET/", EnvDomains: " 11ch.Example.com., b.example.org ,,", EnvToken: testToken, EnvRegion: "fi"},
			want: Config{Self: "https://box-1.example.net", Domains: []string{"11ch.example.com", "b.example.org"}, Token: testToken, Region: "fi"},
		},
		{
			name: "port kept", enabled: true,
			env:  map[string]string{EnvSelf: "http://10.0.0.5:8443", EnvDomains: "example.com", EnvToken: testToken},
			want: Config{Self: "http://10.0.0.5:8443", Domains: []string{"example.com"}, Token: testToken},
		},
		{name: "no domains", env: map[string]string{EnvSelf: "https://a.example.net", EnvToken: testToken}, errHas: EnvDomains},
		{name: "only commas", env: map[string]string{EnvSelf: "https://a.example.net", EnvDomains: ",,", EnvToken: testToken}, errHas: EnvDomains},
		{name: "wildcard domain", env: map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "*.example.com", EnvToken: testToken}, errHas: EnvDomains},
		{name: "no token", env: map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com"}, errHas: EnvToken},
		{name: "path", env: map[string]string{EnvSelf: "https://a.example.net/mesh", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "query", env: map[string]string{EnvSelf: "https://a.example.net?x=1", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "fragment", env: map[string]string{EnvSelf: "https://a.example.net#f", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "userinfo", env: map[string]string{EnvSelf: "https://u:" + testToken + "@a.example.net", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "scheme", env: map[string]string{EnvSelf: "ftp://a.example.net", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "no scheme", env: map[string]string{EnvSelf: "a.example.net", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "bad port", env: map[string]string{EnvSelf: "https://a.example.net:99999", EnvDomains: "example.com", EnvToken: testToken}, errHas: EnvSelf},
		{name: "region with comma", env: map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com", EnvToken: testToken, EnvRegion: "ie,fi"}, errHas: EnvRegion},
		// A route's home_region is lowercase; a box labelled "EU" could never host one.
		{name: "region uppercase", env: map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com", EnvToken: testToken, EnvRegion: "EU"}, errHas: EnvRegion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnv(envOf(tc.env))
			if tc.errHas != "" {
				if err == nil {
					t.Fatalf("accepted: %v", got)
				}
				if !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %q does not name %s", err, tc.errHas)
				}
				if strings.Contains(err.Error(), testToken) {
					t.Fatalf("error leaks the token: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Enabled() != tc.enabled {
				t.Fatalf("Enabled = %v", got.Enabled())
			}
			if got.Self != tc.want.Self || got.Token != tc.want.Token || got.Region != tc.want.Region || !sameStrings(got.Domains, tc.want.Domains) {
				t.Fatalf("got %s domains=%v, want %s domains=%v", got, got.Domains, tc.want, tc.want.Domains)
			}
		})
	}
}

func TestConfigNeverPrintsToken(t *testing.T) {
	cfg, err := ParseEnv(envOf(map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com", EnvToken: testToken}))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(cfg)
	for _, s := range []string{cfg.String(), fmt.Sprint(cfg), fmt.Sprintf("%v %+v %#v %s %q", cfg, cfg, cfg, cfg.Token, cfg.Token), string(js)} {
		if strings.Contains(s, testToken) {
			t.Fatalf("token printed: %s", s)
		}
	}
	if string(cfg.Token) != testToken {
		t.Fatal("token value lost")
	}
}

func TestParseEnvFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "router.env")
	content := `# router env
LCHAT_HIBERNATE_BUCKET=my-bucket
; another comment style

export LCHAT_MESH_SELF="https://box-2.example.net"
LCHAT_MESH_DOMAINS = 11ch.example.com
LCHAT_MESH_TOKEN='` + testToken + `'
LCHAT_MESH_REGION="f\"i"
`
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := ReadEnvFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if env["LCHAT_HIBERNATE_BUCKET"] != "my-bucket" || env[EnvRegion] != `f"i` || env[EnvToken] != testToken {
		t.Fatalf("parsed %q", env)
	}
	// The region holds a quote and is refused; the file's values reach ParseEnv.
	if _, err := ParseEnvFile(p, nil); err == nil || !strings.Contains(err.Error(), EnvRegion) {
		t.Fatalf("ParseEnvFile err = %v", err)
	}
	os.WriteFile(p, []byte("LCHAT_MESH_SELF=https://box-2.example.net\nLCHAT_MESH_DOMAINS=example.com\n"), 0o600)
	cfg, err := ParseEnvFile(p, envOf(map[string]string{EnvToken: testToken, EnvSelf: "https://ignored.example.net"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Self != "https://box-2.example.net" || string(cfg.Token) != testToken {
		t.Fatalf("file must win and fallback fill the gaps: %s", cfg)
	}
	for _, bad := range []string{"NOEQUALS\n", "LCHAT_MESH_TOKEN=\"" + testToken + "\n", "1BAD=x\n"} {
		os.WriteFile(p, []byte(bad), 0o600)
		_, err := ReadEnvFile(p)
		if err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), testToken) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("error %q: want the line number and no value", err)
		}
	}
	if _, err := ReadEnvFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestInScope(t *testing.T) {
	domains := []string{"11ch.example.com", "example.org"}
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"11ch.example.com", true},
		{"8oe.11ch.example.com", true},
		{"8OE.11ch.Example.com.", true},
		{"8oe.11ch.example.com:443", true},
		{"a.b.11ch.example.com", false},
		{"x11ch.example.com", false},
		{"example.com", false},
		{"a.example.org", true},
		{"example.org", true},
		{".example.org", false},
		{"", false},
		{"a.example.net", false},
	} {
		if got := InScope(tc.host, domains); got != tc.want {
			t.Errorf("InScope(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}

// TestParseEnvAcceptList: LCHAT_MESH_TOKEN_ACCEPT is read as a list of tokens, each as
// long as the own token must be, the own token dropped; a short one is refused naming the
// variable and its position, never a value; String counts them without showing them.
func TestParseEnvAcceptList(t *testing.T) {
	next := NewToken()
	base := map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com", EnvToken: testToken}
	env := func(accept string) func(string) string {
		m := map[string]string{EnvTokenAccept: accept}
		for k, v := range base {
			m[k] = v
		}
		return envOf(m)
	}
	got, err := ParseEnv(env(next + ", " + testToken))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Accept) != 1 || got.Accept[0] != Secret(next) {
		t.Fatalf("Accept = %d tokens, want the one that is not the own token", len(got.Accept))
	}
	if s := got.String(); strings.Contains(s, next) || !strings.Contains(s, "accepted_tokens=1") {
		t.Fatalf("String = %q", s)
	}
	_, err = ParseEnv(env(next + ",short-secret-value"))
	if err == nil || !strings.Contains(err.Error(), EnvTokenAccept) || !strings.Contains(err.Error(), "token 2") {
		t.Fatalf("short accepted token: %v", err)
	}
	if strings.Contains(err.Error(), "short-secret-value") || strings.Contains(err.Error(), next) {
		t.Fatalf("error leaks a token: %q", err)
	}
}
