// Package buildinfo says which build of lchat-caddy is running, from the build
// information Go embeds in every binary (runtime/debug.ReadBuildInfo): `lchat-caddy
// version`, the console's VERSION column (through the heartbeat) and GET /lchat/status
// all print it.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// ModulePath is lchat-caddy's module.
const ModulePath = "github.com/lchat/lchat-caddy"

// caddyPath is Caddy's module.
const caddyPath = "github.com/caddyserver/caddy/v2"

// Lchat is the lchat build: the module's version when it was built as a released module
// (go install ...@v1.2.3, or a dependency of an xcaddy build), else the commit it was
// built from (12 hex digits, "+dirty" with uncommitted changes, and the commit's date),
// else "devel" (a build without version control information, such as `go test`'s).
func Lchat() string { return lchat(debug.ReadBuildInfo()) }

// Caddy is the Caddy module's version, "unknown" when the binary does not say.
func Caddy() string { return caddy(debug.ReadBuildInfo()) }

// String is both, as `lchat-caddy version` prints them: "lchat-caddy 0123456789ab
// 2026-05-01 (Caddy v2.11.9)".
func String() string {
	bi, ok := debug.ReadBuildInfo()
	return format(bi, ok)
}

func format(bi *debug.BuildInfo, ok bool) string {
	return "lchat-caddy " + lchat(bi, ok) + " (Caddy " + caddy(bi, ok) + ")"
}

func lchat(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "devel"
	}
	if bi.Main.Path != ModulePath {
		// A dependency of another main module (an xcaddy build): its version says it.
		if m := dep(bi, ModulePath); m != nil {
			if m.Replace != nil {
				if m.Replace.Version != "" {
					return m.Replace.Version
				}
				return "devel (replaced by " + m.Replace.Path + ")"
			}
			return m.Version
		}
		return "devel"
	}
	// A tag says it all; a pseudo-version stamped from the checkout (v0.0.0-2026...-abcdef
	// +dirty) says less than the VCS settings below.
	if v := bi.Main.Version; v != "" && v != "(devel)" && !strings.Contains(v, "+") && !isPseudo(v) {
		return v
	}
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	if day, _, ok := strings.Cut(at, "T"); ok {
		rev += " " + day
	}
	return rev
}

// isPseudo reports whether v is a pseudo-version (vX.Y.Z-yyyymmddhhmmss-abcdefabcdef).
func isPseudo(v string) bool {
	parts := strings.Split(strings.TrimSuffix(v, "+dirty"), "-")
	return len(parts) >= 3 && len(parts[len(parts)-1]) == 12 && len(parts[len(parts)-2]) >= 14
}

func caddy(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "unknown"
	}
	if bi.Main.Path == caddyPath && bi.Main.Version != "" {
		return bi.Main.Version
	}
	if m := dep(bi, caddyPath); m != nil {
		if m.Replace != nil && m.Replace.Version != "" {
			return m.Replace.Version
		}
		return m.Version
	}
	return "unknown"
}

func dep(bi *debug.BuildInfo, path string) *debug.Module {
	for _, d := range bi.Deps {
		if d.Path == path {
			return d
		}
	}
	return nil
}
