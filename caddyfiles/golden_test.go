package caddyfiles

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/lchat/lchat-caddy"
)

var update = flag.Bool("update", false, "rewrite the golden adapt files from the adapter's output")

// adaptJSON adapts a Caddyfile in process, as `lchat-caddy adapt` does, and returns its
// JSON indented with tabs (as Caddy's own caddyfile_adapt tests keep it).
func adaptJSON(t *testing.T, filename string, body []byte) string {
	t.Helper()
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(body, map[string]any{"filename": filename})
	if err != nil {
		t.Fatalf("adapting %s: %v", filename, err)
	}
	for _, w := range warnings {
		t.Logf("%s:%d: %s: %s", filename, w.Line, w.Directive, w.Message)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// compareGolden reports a difference between got and the golden want, line by line.
func compareGolden(t *testing.T, name, want, got string) {
	t.Helper()
	want, got = strings.TrimSpace(want), strings.TrimSpace(got)
	if want == got {
		return
	}
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			t.Fatalf("%s: the adapted JSON differs from the golden file at line %d:\n  golden: %s\n  got:    %s\n(go test ./caddyfiles -run Golden -update rewrites the golden files; review the diff)", name, i+1, w, g)
		}
	}
}

// The shipped Caddyfiles, each adapted with the environment it names, against its whole
// JSON in adapt/<file>.json. Environment values that stay {env.*} placeholders are set
// to markers, so the golden file shows they were not expanded at adapt time.
func TestGoldenShippedCaddyfiles(t *testing.T) {
	for _, tc := range []struct {
		file string
		env  map[string]string
	}{
		{"single.Caddyfile", nil},
		{"mesh.Caddyfile", map[string]string{"LCHAT_MESH_SELF": "https://box-1.example.net", "LCHAT_CERT_CACHE": "s3",
			"LCHAT_PROXY_PROTOCOL_FROM": "10.0.1.0/24,10.0.2.0/24", "LCHAT_SHUTDOWN_DELAY": "15s"}},
		{"dev.Caddyfile", map[string]string{"LCHAT_DEV_DIR": "/tmp/lchat-dev"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			for _, k := range []string{"LCHAT_ADMIN_LISTEN", "LCHAT_HTTP_PORT", "LCHAT_HTTPS_PORT", "LCHAT_CERT_CACHE",
				"LCHAT_STATE_DIR", "LCHAT_DNS_PROVIDER", "LCHAT_DEV_DIR", "LCHAT_MESH_SELF",
				"LCHAT_PROXY_PROTOCOL_FROM", "LCHAT_SHUTDOWN_DELAY", "LCHAT_HEALTH_PORT"} {
				t.Setenv(k, tc.env[k])
				if tc.env[k] == "" {
					os.Unsetenv(k)
				}
			}
			for _, k := range []string{"LCHAT_HIBERNATE_BUCKET", "LCHAT_DNSIMPLE_TOKEN", "LCHAT_WILDCARD_DOMAINS", "LCHAT_MESH_TOKEN"} {
				t.Setenv(k, "must-not-appear")
			}
			body, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			got := adaptJSON(t, tc.file, body)
			if strings.Contains(got, "must-not-appear") {
				t.Errorf("an environment value was expanded at adapt time")
			}
			golden := filepath.Join("adapt", tc.file+".json")
			if *update {
				if err := os.WriteFile(golden, []byte(got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			compareGolden(t, golden, string(want), got)
		})
	}
}

// Every module's Caddyfile syntax, as Caddy's caddytest/integration/caddyfile_adapt
// keeps it: adapt/*.caddyfiletest is a Caddyfile, a line of ten dashes, and its whole
// JSON.
func TestGoldenModules(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("adapt", "*.caddyfiletest"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no adapt/*.caddyfiletest files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, want, ok := strings.Cut(string(data), "----------")
			if !ok {
				t.Fatalf("%s has no ---------- line", f)
			}
			caddyfile = strings.TrimSpace(caddyfile) + "\n"
			got := adaptJSON(t, f, []byte(caddyfile))
			if *update {
				if err := os.WriteFile(f, []byte(caddyfile+"----------\n"+got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			compareGolden(t, f, want, got)
		})
	}
}
