package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestVersions(t *testing.T) {
	caddyDep := &debug.Module{Path: caddyPath, Version: "v2.11.9"}
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "ce55124aaaabbbbccccddddeeeeffff000011112"}, {Key: "vcs.time", Value: "2026-05-01T10:00:00Z"}}
	dirty := append(vcs[:2:2], debug.BuildSetting{Key: "vcs.modified", Value: "true"})
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"a checkout's build", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "v0.0.0-20260501100000-ce55124aaaab"}, Deps: []*debug.Module{caddyDep}, Settings: vcs},
			"lchat-caddy ce55124aaaab 2026-05-01 (Caddy v2.11.9)"},
		{"uncommitted changes", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "v0.0.0-20260501100000-ce55124aaaab+dirty"}, Deps: []*debug.Module{caddyDep}, Settings: dirty},
			"lchat-caddy ce55124aaaab+dirty 2026-05-01 (Caddy v2.11.9)"},
		{"a tagged release", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "v1.4.0"}, Deps: []*debug.Module{caddyDep}, Settings: vcs},
			"lchat-caddy v1.4.0 (Caddy v2.11.9)"},
		{"an xcaddy build", &debug.BuildInfo{Main: debug.Module{Path: "caddy", Version: "(devel)"}, Deps: []*debug.Module{caddyDep, {Path: ModulePath, Version: "v1.4.0"}}},
			"lchat-caddy v1.4.0 (Caddy v2.11.9)"},
		{"no version control", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "(devel)"}, Deps: []*debug.Module{caddyDep}},
			"lchat-caddy devel (Caddy v2.11.9)"},
	} {
		if got := format(c.bi, true); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := format(nil, false); got != "lchat-caddy devel (Caddy unknown)" {
		t.Errorf("no build info: %q", got)
	}
}
