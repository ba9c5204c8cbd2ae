package lchat

import (
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/standard"
)

// TestFailedReloadKeepsKinds: a reload that fails (to provision, or to start after the
// lchat app started) leaves the running engine with the running config's kinds; a
// reload that succeeds applies its own.
func TestFailedReloadKeepsKinds(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	config := func(kind string, routes []any, listen string) []byte {
		return reloadConfig(dir, "registry.db", kind, routes, listen)
	}
	kinds := func() []string {
		t.Helper()
		app, err := caddy.ActiveContext().App("lchat")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for n := range app.(*App).Engine().Kinds() {
			names = append(names, n)
		}
		slices.Sort(names)
		return names
	}
	lchatRoute := map[string]any{"handle": []any{map[string]any{"handler": "lchat"}}}

	if err := caddy.Load(config("old", nil, ""), true); err != nil {
		t.Fatal(err)
	}
	defer caddy.Stop()
	if got := kinds(); !slices.Equal(got, []string{"old"}) {
		t.Fatalf("kinds after the first load: %v", got)
	}

	// The lchat handler provisions the lchat app (kinds "new") before the unknown
	// handler after it fails the config.
	broken := []any{lchatRoute, map[string]any{"handle": []any{map[string]any{"handler": "no_such_handler_lchat_test"}}}}
	if err := caddy.Load(config("new", broken, "127.0.0.1:0"), true); err == nil {
		t.Fatal("a config with an unknown handler loaded")
	}
	if got := kinds(); !slices.Equal(got, []string{"old"}) {
		t.Fatalf("kinds after a reload that failed to provision: %v, want [old]", got)
	}

	// The http app cannot bind a busy port: its start fails. Apps start in map order, so
	// try several times to have the lchat app start (and be unwound) first.
	for range 8 {
		err := caddy.Load(config("new", []any{lchatRoute}, busy.Addr().String()), true)
		if err == nil || !strings.Contains(err.Error(), "start") {
			t.Fatalf("a config listening on a busy port: %v, want a start error", err)
		}
		if got := kinds(); !slices.Equal(got, []string{"old"}) {
			t.Fatalf("kinds after a reload that failed to start: %v, want [old]", got)
		}
	}

	if err := caddy.Load(config("new", []any{lchatRoute}, "127.0.0.1:0"), true); err != nil {
		t.Fatal(err)
	}
	if got := kinds(); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("kinds after a successful reload: %v, want [new]", got)
	}
}

// reloadConfig is a config of the lchat app in dir with one kind and the registry file
// registry, with an http server on listen serving routes when routes is not nil.
func reloadConfig(dir, registry, kind string, routes []any, listen string) []byte {
	apps := map[string]any{
		"lchat": map[string]any{
			"bucket":    map[string]any{"backend": "file", "root": filepath.Join(dir, "bucket")},
			"state_dir": filepath.Join(dir, "state"),
			"registry":  filepath.Join(dir, registry),
			"kinds":     map[string]any{kind: map[string]any{"command": "/bin/true"}},
		},
	}
	if routes != nil {
		apps["http"] = map[string]any{"servers": map[string]any{"s": map[string]any{
			"listen": []string{listen}, "automatic_https": map[string]any{"disable": true}, "routes": routes,
		}}}
	}
	b, _ := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true},
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(dir, "caddy")},
		"apps":    apps,
	})
	return b
}

// TestMetricsFollowTheStartedConfig: the metrics read the box of the config that started:
// a reload onto another registry that fails to provision or to start leaves them on the
// running config's box (before, a config pointed them at its own box in Provision, which
// a failed reload then closed), and a reload that succeeds moves them.
func TestMetricsFollowTheStartedConfig(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	lchatRoute := map[string]any{"handle": []any{map[string]any{"handler": "lchat"}}}
	running := func() *App {
		t.Helper()
		app, err := caddy.ActiveContext().App("lchat")
		if err != nil {
			t.Fatal(err)
		}
		return app.(*App)
	}
	if err := caddy.Load(reloadConfig(dir, "a.db", "demo", nil, ""), true); err != nil {
		t.Fatal(err)
	}
	defer caddy.Stop()
	first := running().box
	if current.Load() != first {
		t.Fatal("the metrics do not read the started config's box")
	}
	broken := []any{lchatRoute, map[string]any{"handle": []any{map[string]any{"handler": "no_such_handler_lchat_test"}}}}
	if err := caddy.Load(reloadConfig(dir, "b.db", "demo", broken, "127.0.0.1:0"), true); err == nil {
		t.Fatal("a config with an unknown handler loaded")
	}
	if current.Load() != first {
		t.Fatal("a reload that failed to provision moved the metrics")
	}
	for range 8 {
		if err := caddy.Load(reloadConfig(dir, "b.db", "demo", []any{lchatRoute}, busy.Addr().String()), true); err == nil {
			t.Fatal("a config listening on a busy port loaded")
		}
		if current.Load() != first {
			t.Fatal("a reload that failed to start moved the metrics")
		}
	}
	if err := caddy.Load(reloadConfig(dir, "b.db", "demo", []any{lchatRoute}, "127.0.0.1:0"), true); err != nil {
		t.Fatal(err)
	}
	if b := running().box; b == first || current.Load() != b {
		t.Fatal("a reload that succeeded did not move the metrics to its box")
	}
}
