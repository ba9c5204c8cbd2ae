package lchat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// providersCaddyfile is docs/configuration.md's provider example as a Caddyfile, and
// providersJSON the same config in the JSON form that section shows (durations as
// strings, which the app reads as the adapter's nanoseconds).
const (
	providersCaddyfile = `{
	lchat {
		provider partner {
			url https://provider.example.net
			token {env.PARTNER_TOKEN}
			accept_token {env.PARTNER_SIGN_TOKEN}
			domains rooms.example.com
			max_spaces 100
			trusted_ca_files /etc/lchat/partner-ca.pem
			dial_timeout 5s
			response_header_timeout 2m
			max_response_bytes 256MiB
			max_export_bytes 8GiB
		}
		provider_client fleet-a {
			token {env.FLEET_A_TOKEN}
			sign_token {file./etc/lchat/fleet-a-sign-token}
			domains rooms.example.com {env.FLEET_A_MORE_DOMAINS}
			max_spaces 100
			max_export_bytes 8GiB
		}
	}
}

provider.example.net {
	lchat_provider_api
	lchat
}
`
	providersJSON = `{
"providers": [{
  "name": "partner", "url": "https://provider.example.net",
  "token": "{env.PARTNER_TOKEN}", "accept_token": "{env.PARTNER_SIGN_TOKEN}",
  "domains": ["rooms.example.com"], "max_spaces": 100,
  "trusted_ca_files": ["/etc/lchat/partner-ca.pem"],
  "dial_timeout": "5s", "response_header_timeout": "2m",
  "max_response_bytes": 268435456, "max_export_bytes": 8589934592
}],
"provider_clients": [{
  "name": "fleet-a", "token": "{env.FLEET_A_TOKEN}", "sign_token": "{file./etc/lchat/fleet-a-sign-token}",
  "domains": ["rooms.example.com", "{env.FLEET_A_MORE_DOMAINS}"], "max_spaces": 100, "max_export_bytes": 8589934592
}]
}`
)

// TestProvidersCaddyfileAdaptsToTheJSON: the provider and provider_client blocks adapt
// to exactly the lchat app's JSON form of the same config (tokens as placeholders, never
// their values), and lchat_provider_api to its handler, before lchat.
func TestProvidersCaddyfileAdaptsToTheJSON(t *testing.T) {
	cfg := adaptCaddyfile(t, providersCaddyfile)
	var got, want App
	if err := json.Unmarshal(cfg.Apps["lchat"], &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(providersJSON), &want); err != nil {
		t.Fatal(err)
	}
	gotJSON, _ := json.Marshal(&got)
	wantJSON, _ := json.Marshal(&want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("adapted lchat app:\n%s\nwant the JSON form:\n%s", cfg.Apps["lchat"], providersJSON)
	}
	var http struct {
		Servers map[string]struct {
			Routes []struct {
				Handle []struct {
					Routes []struct {
						Handle []struct {
							Handler string `json:"handler"`
						} `json:"handle"`
					} `json:"routes"`
				} `json:"handle"`
			} `json:"routes"`
		} `json:"servers"`
	}
	if err := json.Unmarshal(cfg.Apps["http"], &http); err != nil {
		t.Fatal(err)
	}
	var handlers []string
	for _, srv := range http.Servers {
		for _, rt := range srv.Routes {
			for _, sub := range rt.Handle {
				for _, r := range sub.Routes {
					for _, h := range r.Handle {
						handlers = append(handlers, h.Handler)
					}
				}
			}
		}
	}
	if !reflect.DeepEqual(handlers, []string{"lchat_provider_api", "lchat"}) {
		t.Errorf("site handlers %v, want the provider API before lchat\n%s", handlers, cfg.Apps["http"])
	}
}

// TestProvidersCaddyfileProvisions: the adapted config provisions like the JSON one,
// tokens read from the environment and a file, and a bad token is named, never shown.
func TestProvidersCaddyfileProvisions(t *testing.T) {
	dir := t.TempDir()
	ca := harness.NewTestCA(t, dir, "provider.example.net").CAFile
	signFile := filepath.Join(dir, "sign-token")
	const signToken = "fleet-a-sign-token-0123456789abcdef0123"
	if err := os.WriteFile(signFile, []byte(signToken), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CF_PARTNER_TOKEN", "partner-token-0123456789abcdef0123456789")
	t.Setenv("CF_PARTNER_SIGN", "partner-sign-0123456789abcdef0123456789a")
	t.Setenv("CF_FLEET_A_TOKEN", "fleet-a-token-0123456789abcdef012345678")
	body := func(partnerSign string) string {
		return `{
	lchat {
		provider partner {
			url https://provider.example.net
			token {env.CF_PARTNER_TOKEN}
			accept_token ` + partnerSign + `
			domains rooms.example.com
			trusted_ca_files ` + ca + `
		}
		provider_client fleet-a {
			token {env.CF_FLEET_A_TOKEN}
			sign_token {file.` + signFile + `}
			domains rooms.example.com
		}
	}
}`
	}
	a := adaptedApp(t, body("{env.CF_PARTNER_SIGN}"))
	if err := a.provisionProviders(); err != nil {
		t.Fatal(err)
	}
	defer a.prov.close()
	c := a.prov.conn("partner")
	if c == nil || string(c.P.Token) != os.Getenv("CF_PARTNER_TOKEN") || string(c.P.AcceptToken) != os.Getenv("CF_PARTNER_SIGN") {
		t.Fatalf("provider partner not provisioned with the environment's tokens")
	}
	if cl := a.prov.clients.Named("fleet-a"); cl == nil || string(cl.SignToken) != signToken {
		t.Fatalf("client fleet-a not provisioned with the file's sign token")
	}

	// A token too short is named by its field; its value appears nowhere.
	const short = "too-short-secret"
	t.Setenv("CF_SHORT", short)
	a = adaptedApp(t, body("{env.CF_SHORT}"))
	err := a.provisionProviders()
	if err == nil || !strings.Contains(err.Error(), "accept_token") || strings.Contains(err.Error(), short) {
		t.Fatalf("short accept_token: %v", err)
	}
}

// TestProvidersCaddyfileErrors: each mistake in a provider block is named with its
// line, and no error repeats a token.
func TestProvidersCaddyfileErrors(t *testing.T) {
	const secret = "literal-token-0123456789abcdef0123456789"
	full := "url https://p.example.net\n token {env.T}\n accept_token {env.A}\n domains rooms.example.com\n"
	for input, want := range map[string]string{
		"lchat {\n provider\n}":                                                   "wrong argument count",
		"lchat {\n provider Partner {\n " + full + "}\n}":                         `provider name "Partner"`,
		"lchat {\n provider p {\n " + full + " colour blue\n }\n}":                "provider p: unrecognized subdirective colour",
		"lchat {\n provider p {\n url http://p.example.net\n }\n}":                "the scheme must be https",
		"lchat {\n provider p {\n url https://p.example.net/api\n }\n}":           "no path",
		"lchat {\n provider p {\n token " + secret + "\n }\n}":                    "token must be a placeholder",
		"lchat {\n provider p {\n accept_token {env.A}{env.B}\n }\n}":             "accept_token must be a placeholder",
		"lchat {\n provider p {\n token {env.T}\n token {env.U}\n }\n}":           "token given twice",
		"lchat {\n provider p {\n token\n }\n}":                                   "wrong argument count",
		"lchat {\n provider p {\n domains\n }\n}":                                 "wrong argument count",
		"lchat {\n provider p {\n domains not_a_host!\n }\n}":                     "provider p: domains",
		"lchat {\n provider p {\n max_spaces -1\n }\n}":                           "max_spaces: want 0 (no cap)",
		"lchat {\n provider p {\n dial_timeout soon\n }\n}":                       "dial_timeout: want a positive duration",
		"lchat {\n provider p {\n max_response_bytes lots\n }\n}":                 "max_response_bytes: want a size",
		"lchat {\n provider p {\n url https://p.example.net\n }\n}":               "provider p: missing accept_token, domains, token",
		"lchat {\n provider p {\n " + full + "}\n provider p {\n" + full + "}\n}": "provider p given twice",
		"lchat {\n provider_client f {\n url https://p.example.net\n }\n}":        "provider_client f: unrecognized subdirective url",
		"lchat {\n provider_client f {\n sign_token " + secret + "\n }\n}":        "sign_token must be a placeholder",
		"lchat {\n provider_client f {\n token {env.T}\n }\n}":                    "provider_client f: missing domains, sign_token",
		"lchat {\n provider_client f {\n max_export_bytes 0\n }\n}":               "max_export_bytes: want a size",
	} {
		var a App
		err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Testfile:") {
			t.Errorf("%q: err=%v, want %q with its line", input, err, want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%q: the error repeats the token: %v", input, err)
		}
	}

	// A repeated lchat option merges: a provider of the first block is still there, and
	// naming it again in the second is refused.
	first := "{\n lchat {\n provider p {\n " + full + " }\n }\n lchat {\n provider q {\n " + full + " }\n }\n}"
	if a := adaptedApp(t, first); len(a.Providers) != 2 || a.Providers[0].Name != "p" || a.Providers[1].Name != "q" {
		t.Errorf("merged providers %+v", a.Providers)
	}
	again := "{\n lchat {\n provider p {\n " + full + " }\n }\n lchat {\n provider p {\n " + full + " }\n }\n}"
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(again), nil); err == nil || !strings.Contains(err.Error(), "provider p given twice") {
		t.Errorf("a provider named in two lchat blocks: %v", err)
	}
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("p.example.net {\n lchat_provider_api extra\n}"), nil); err == nil ||
		!strings.Contains(err.Error(), "lchat_provider_api takes no arguments") {
		t.Errorf("lchat_provider_api with an argument: %v", err)
	}
}

// adaptCaddyfile adapts body with Caddy's Caddyfile adapter.
func adaptCaddyfile(t *testing.T, body string) struct{ Apps map[string]json.RawMessage } {
	t.Helper()
	out, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warn {
		t.Logf("adapt warning: %s", w.Message)
	}
	var cfg struct{ Apps map[string]json.RawMessage }
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// adaptedApp is the lchat app of body, adapted and decoded as Caddy would load it.
func adaptedApp(t *testing.T, body string) *App {
	t.Helper()
	a := new(App)
	if err := json.Unmarshal(adaptCaddyfile(t, body).Apps["lchat"], a); err != nil {
		t.Fatal(err)
	}
	return a
}
