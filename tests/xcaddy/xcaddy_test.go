// Package xcaddy_test proves that an xcaddy build of this checkout, driven by xcaddy.json,
// yields a Caddy that lists every lchat module.
package xcaddy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/internal/xcaddybuild"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// ourModules are the module IDs an xcaddy build with our plugin must list.
var ourModules = []string{
	"admin.api.derp_switch",
	"admin.api.lchat",
	"admin.api.lchat_ids",
	"admin.api.lchat_mesh",
	"caddy.storage.lchat",
	"derp_switch",
	"dns.providers.dnsimple",
	"dns.providers.route53",
	"http.handlers.lchat",
	"http.handlers.lchat_mesh_api",
	"lchat",
	"lchat.buckets.file",
	"lchat.buckets.s3",
}

func TestXcaddyBuildListsOurModules(t *testing.T) {
	if testing.Short() {
		t.Skip("xcaddy build takes minutes; skipped with -short")
	}
	root := harness.RepoRoot()
	m, err := xcaddybuild.Load(filepath.Join(root, "xcaddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "caddy")
	checkout := map[string]string{"github.com/lchat/lchat-caddy": root}
	args := m.Args(root, out, checkout)
	env, err := m.Env(os.Environ(), root, t.TempDir(), checkout)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(harness.Tool(t, "xcaddy"), args...)
	cmd.Dir = t.TempDir()
	cmd.Env = env
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xcaddy %v: %v\n%s", args, err, output)
	}
	checkModules(t, out)
}

// checkModules runs `<bin> list-modules` and requires every lchat module and Caddy's
// standard ones.
func checkModules(t *testing.T, bin string) {
	t.Helper()
	listed, err := exec.Command(bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, listed)
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(listed), "\n") {
		have[strings.TrimSpace(line)] = true
	}
	for _, id := range ourModules {
		if !have[id] {
			t.Errorf("%s does not list module %s", filepath.Base(bin), id)
		}
	}
	if !have["http.handlers.reverse_proxy"] {
		t.Errorf("%s lacks Caddy's standard modules", filepath.Base(bin))
	}
}

// TestOwnBuild: cmd/lchat-caddy is Caddy with the standard modules and ours, and
// `version` names the lchat build, then the Caddy it is built on.
func TestOwnBuild(t *testing.T) {
	bin := harness.Binary(t)
	checkModules(t, bin)
	m, err := xcaddybuild.Load(filepath.Join(harness.RepoRoot(), "xcaddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "lchat-caddy ") || !strings.Contains(string(out), ", Caddy "+m.CaddyVersion) {
		t.Fatalf("version: %v: %q, want lchat-caddy <build>, Caddy %s", err, out, m.CaddyVersion)
	}
}

func TestManifestArgs(t *testing.T) {
	m := &xcaddybuild.Manifest{
		CaddyVersion: "v2.11.9",
		Plugins: []xcaddybuild.Plugin{
			{Module: "github.com/lchat/lchat-caddy", Replace: "."},
			{Module: "github.com/example/plugin", Version: "v1.2.3"},
		},
	}
	got := strings.Join(m.Args("/src", "out/caddy", map[string]string{"github.com/example/plugin": "/tmp/p"}), " ")
	want := "build v2.11.9 --output /src/out/caddy --with github.com/lchat/lchat-caddy=/src --with github.com/example/plugin=/tmp/p"
	if got != want {
		t.Errorf("Args:\n got %s\nwant %s", got, want)
	}
}

func TestManifestEnvOffersReplacedPluginLocally(t *testing.T) {
	root := harness.RepoRoot()
	m := &xcaddybuild.Manifest{
		CaddyVersion: "v2.11.9",
		Plugins:      []xcaddybuild.Plugin{{Module: "github.com/lchat/lchat-caddy", Replace: "."}},
	}
	proxy := t.TempDir()
	env, err := m.Env([]string{"HOME=/h", "GOPROXY=https://example.test"}, root, proxy, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(env, "\n")
	for _, want := range []string{"HOME=/h", "GOPROXY=file://" + proxy + ",https://example.test", "GONOSUMDB=github.com/lchat/lchat-caddy"} {
		if !strings.Contains(got, want) {
			t.Errorf("env lacks %q:\n%s", want, got)
		}
	}
	list, err := os.ReadFile(filepath.Join(proxy, "github.com/lchat/lchat-caddy/@v/list"))
	if err != nil || strings.TrimSpace(string(list)) == "" {
		t.Fatalf("local proxy has no version list: %q, %v", list, err)
	}
	if _, err := m.Env(nil, t.TempDir(), proxy, nil); err == nil {
		t.Error("Env accepted a replacement directory without go.mod")
	}
}

// TestManifestAgreesWithGoMod: xcaddy.json names the Caddy our go.mod builds with and the
// xcaddy tools/go.mod pins, so the manifest cannot drift from what the tests prove.
func TestManifestAgreesWithGoMod(t *testing.T) {
	root := harness.RepoRoot()
	m, err := xcaddybuild.Load(filepath.Join(root, "xcaddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	required := func(gomod, module string) string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(root, gomod))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
			if len(f) >= 2 && f[0] == module {
				return f[1]
			}
		}
		t.Fatalf("%s does not require %s", gomod, module)
		return ""
	}
	if got := required("go.mod", "github.com/caddyserver/caddy/v2"); got != m.CaddyVersion {
		t.Errorf("xcaddy.json caddy_version %s, go.mod has caddy %s", m.CaddyVersion, got)
	}
	if got := required("tools/go.mod", "github.com/caddyserver/xcaddy"); got != m.XcaddyVersion {
		t.Errorf("xcaddy.json xcaddy_version %s, tools/go.mod pins xcaddy %s", m.XcaddyVersion, got)
	}
}
