// Package providers runs the provider seam end to end: two fleets of real lchat-caddy
// processes on loopback, each with its own bucket (versitygw), mesh token and
// certificate, one delegating a space to the other (docs/providers.md).
package providers

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// The tokens of the test: each fleet's mesh token, and one per direction per client.
const (
	meshTokenA = "mesh-token-of-fleet-a-0123456789abcdef"
	meshTokenB = "mesh-token-of-fleet-b-0123456789abcdef"
	tokenAToB  = "fleet-a-to-partner-token-0123456789abcd" // fleet A's token for its provider
	tokenBToA  = "partner-to-fleet-a-token-0123456789abcd" // what the provider signs for A
	tokenCToB  = "fleet-c-to-partner-token-0123456789abcd" // another client of the provider
	tokenBToC  = "partner-to-fleet-c-token-0123456789abcd"
	// envSecret is a delegated space's own env value: it reaches the provider with the
	// space, and no log.
	envSecret = "s3cr3t-delegated-env-value"
	domainA   = "a.test"
	domainB   = "b.test"
)

// node is one box of a fleet.
type node struct {
	*harness.Box
	ip, addr, self string
}

// fleet is a set of boxes on one bucket with one mesh token and one certificate.
type fleet struct {
	t         *testing.T
	name      string
	s3        *harness.S3
	prefix    string
	ca        *harness.TestCA
	meshToken string
	domain    string
	// lchat adds fields to the lchat app; api puts the provider API in front.
	lchat map[string]any
	api   bool
	nodes []*node
}

func newFleet(t *testing.T, name, domain, meshToken string) *fleet {
	return &fleet{t: t, name: name, s3: harness.StartS3(t), prefix: name + "/", ca: harness.NewTestCA(t, t.TempDir(), domain),
		meshToken: meshToken, domain: domain}
}

// kind is the demo room holding its WebSockets and event streams, checkpointing every
// second.
func kind() map[string]any {
	return harness.DemoKind(map[string]any{
		"idle_timeout": "10m",
		"replication":  map[string]any{"class": "periodic", "interval": "1s"},
		"allowed_env":  []string{"DEMO_SECRET"},
		"env":          map[string]string{"DEMO_HOLD_CONNECTIONS": "1"},
	})
}

// addr reserves the address of the fleet's next box on ip.
func (f *fleet) addr(ip string) string { return net.JoinHostPort(ip, harness.FreePort(f.t, ip)) }

// start starts a box of the fleet on addr.
func (f *fleet) start(addr string) *node {
	t := f.t
	t.Helper()
	ip, _, _ := net.SplitHostPort(addr)
	n := &node{ip: ip, addr: addr, self: "https://" + addr}
	app := map[string]any{
		"wake_scan_interval": "1s",
		"mesh":               map[string]any{"beat": "1s", "dead_after": "4s", "trusted_ca_files": []string{f.ca.CAFile}},
		"kinds":              map[string]any{"demo": kind()},
	}
	for k, v := range f.lchat {
		app[k] = v
	}
	cfg := harness.Config{Listen: addr, Lchat: app, MeshAPIHost: ip, CertFile: f.ca.CertFile, KeyFile: f.ca.KeyFile}.JSON()
	if f.api {
		cfg = withProviderAPI(t, cfg)
	}
	env := append(f.s3.Env(f.prefix), mesh.EnvSelf+"="+n.self, mesh.EnvDomains+"="+f.domain, mesh.EnvToken+"="+f.meshToken)
	n.Box = harness.StartBox(t, harness.BoxOptions{JSON: cfg, Env: env, IP: ip})
	f.nodes = append(f.nodes, n)
	t.Cleanup(func() {
		logs := n.Logs()
		for what, secret := range map[string]string{"the mesh token": f.meshToken, "a provider token": tokenAToB,
			"a signing token": tokenBToA, "another client's token": tokenCToB, "the S3 secret key": f.s3.SecretKey, "an env value": envSecret} {
			if strings.Contains(logs, secret) {
				t.Errorf("%s %s logged %s", f.name, n.self, what)
			}
		}
	})
	return n
}

// withProviderAPI puts http.handlers.lchat_provider_api first on the main server: the
// provider API under /api/provider/ on any host, the rest as before.
func withProviderAPI(t *testing.T, cfg string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(cfg), &m); err != nil {
		t.Fatal(err)
	}
	srv := m["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["main"].(map[string]any)
	routes := srv["routes"].([]any)
	srv["routes"] = append([]any{map[string]any{
		"match":  []any{map[string]any{"path": []string{"/api/provider/*"}}},
		"handle": []any{map[string]any{"handler": "lchat_provider_api"}},
	}}, routes...)
	out, _ := json.Marshal(m)
	return string(out)
}

// client sends every request to n, verifying its certificate with the fleet's CA.
func (f *fleet) client(n *node) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, n.addr)
			},
			TLSClientConfig: &tls.Config{RootCAs: f.ca.Pool},
		},
		Timeout: time.Minute,
	}
}

// do sends method https://host+path to n.
func (f *fleet) do(n *node, method, host, path, body string) (int, http.Header, string) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, "https://"+host+path, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := f.client(n).Do(req)
	if err != nil {
		f.t.Fatalf("%s https://%s%s via %s: %v", method, host, path, n.self, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

func (f *fleet) mustDo(n *node, method, host, path, body string, want int) string {
	f.t.Helper()
	code, _, data := f.do(n, method, host, path, body)
	if code != want {
		f.t.Fatalf("%s https://%s%s via %s: %d, want %d: %.300s", method, host, path, n.self, code, want, data)
	}
	return data
}

func (f *fleet) post(n *node, host, text string) {
	f.t.Helper()
	f.mustDo(n, http.MethodPost, host, "/api/messages", fmt.Sprintf(`{"author":"test","text":%q}`, text), http.StatusCreated)
}

func (f *fleet) createSpace(n *node, host string) {
	f.t.Helper()
	n.AdminJSON(http.MethodPost, "/lchat/routes", map[string]any{"host": host, "kind": "demo",
		"env": map[string]string{"DEMO_SECRET": envSecret}}, http.StatusCreated, nil)
}

// route is n's row for host.
func route(t *testing.T, n *node, host string) map[string]any {
	var rt map[string]any
	n.AdminJSON(http.MethodGet, "/lchat/routes/"+host, nil, http.StatusOK, &rt)
	return rt
}

// apiCall calls fleet B's provider API as a client with token.
func apiCall(t *testing.T, b *fleet, n *node, token, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "https://"+n.addr+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := b.client(n).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}
