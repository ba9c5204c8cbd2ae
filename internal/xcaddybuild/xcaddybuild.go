// Package xcaddybuild reads xcaddy.json, the manifest of our xcaddy build, and turns it into
// the arguments of `xcaddy build`.
package xcaddybuild

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Manifest is the content of xcaddy.json.
type Manifest struct {
	// CaddyVersion is the Caddy core version to build, e.g. "v2.11.9".
	CaddyVersion string `json:"caddy_version"`
	// XcaddyVersion is the xcaddy release the build is known to work with (tools/go.mod pins it).
	XcaddyVersion string `json:"xcaddy_version,omitempty"`
	// Output is the binary to write, relative to the manifest's directory.
	Output string `json:"output,omitempty"`
	// Plugins are the modules to build in.
	Plugins []Plugin `json:"plugins"`
}

// Plugin is one --with argument.
type Plugin struct {
	// Module is the Go module path.
	Module string `json:"module"`
	// Version pins the module version; empty means latest, unless Replace is set.
	Version string `json:"version,omitempty"`
	// Replace is a local directory (relative to the manifest) to build from instead of a version.
	Replace string `json:"replace,omitempty"`
}

// Load reads and validates a manifest.
func Load(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %v", err)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("parsing %s: %v", path, err)
	}
	if m.CaddyVersion == "" {
		return nil, fmt.Errorf("%s: caddy_version is required", path)
	}
	for i, p := range m.Plugins {
		if p.Module == "" {
			return nil, fmt.Errorf("%s: plugins[%d].module is required", path, i)
		}
		if p.Version != "" && p.Replace != "" {
			return nil, fmt.Errorf("%s: plugins[%d] sets both version and replace", path, i)
		}
	}
	return &m, nil
}

// Args returns the `xcaddy build` arguments. dir is the manifest's directory, against which
// relative replace paths and the output are resolved. overrides replaces a plugin's replace
// directory by module path (used to build a given checkout).
func (m *Manifest) Args(dir, output string, overrides map[string]string) []string {
	if output == "" {
		output = m.Output
	}
	if output == "" {
		output = "lchat-caddy"
	}
	if !filepath.IsAbs(output) {
		output = filepath.Join(dir, output)
	}
	args := []string{"build", m.CaddyVersion, "--output", output}
	for _, p := range m.Plugins {
		with := p.Module
		switch repl := overrides[p.Module]; {
		case repl != "":
			with += "=" + repl
		case p.Replace != "":
			r := p.Replace
			if !filepath.IsAbs(r) {
				r = filepath.Join(dir, r)
			}
			with += "=" + r
		case p.Version != "":
			with += "@" + p.Version
		}
		args = append(args, "--with", with)
	}
	return args
}

// localVersion is the version the local module proxy offers for a replaced plugin.
const localVersion = "v0.0.0-local"

// Env returns the environment for running xcaddy. xcaddy v0.4.5 runs `go get <module>` even
// for a plugin replaced by a local directory when the plugin's package is the module root,
// and that asks the module proxy for the module's versions; an unpublished module (or an
// offline machine) fails there. So each replaced plugin is offered by a file-based module
// proxy in proxyDir, listing one version whose go.mod is the checkout's own. The replace
// directive then makes the build use the checkout; the proxy only answers the version query.
func (m *Manifest) Env(base []string, dir, proxyDir string, overrides map[string]string) ([]string, error) {
	var nosum []string
	for _, p := range m.Plugins {
		repl := overrides[p.Module]
		if repl == "" {
			repl = p.Replace
		}
		if repl == "" {
			continue
		}
		if !filepath.IsAbs(repl) {
			repl = filepath.Join(dir, repl)
		}
		gomod, err := os.ReadFile(filepath.Join(repl, "go.mod"))
		if err != nil {
			return nil, fmt.Errorf("plugin %s: reading its go.mod: %v", p.Module, err)
		}
		vdir := filepath.Join(proxyDir, filepath.FromSlash(p.Module), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return nil, err
		}
		files := map[string][]byte{
			"list":                 []byte(localVersion + "\n"),
			localVersion + ".info": []byte(`{"Version":"` + localVersion + `","Time":"2026-01-01T00:00:00Z"}`),
			localVersion + ".mod":  gomod,
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
				return nil, err
			}
		}
		nosum = append(nosum, p.Module)
	}
	if len(nosum) == 0 {
		return base, nil
	}
	goproxy, gonosumdb := "https://proxy.golang.org,direct", ""
	env := make([]string, 0, len(base)+2)
	for _, kv := range base {
		switch {
		case strings.HasPrefix(kv, "GOPROXY="):
			goproxy = strings.TrimPrefix(kv, "GOPROXY=")
		case strings.HasPrefix(kv, "GONOSUMDB="):
			gonosumdb = strings.TrimPrefix(kv, "GONOSUMDB=")
		default:
			env = append(env, kv)
		}
	}
	if gonosumdb != "" {
		nosum = append(nosum, gonosumdb)
	}
	proxyURL := "file://" + filepath.ToSlash(proxyDir)
	return append(env,
		"GOPROXY="+proxyURL+","+goproxy,
		"GONOSUMDB="+strings.Join(nosum, ","),
	), nil
}
