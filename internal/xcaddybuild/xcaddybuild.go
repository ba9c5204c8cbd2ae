// Package xcaddybuild reads xcaddy.json, the manifest of our xcaddy build, and turns it into
// the arguments of `xcaddy build`.
package xcaddybuild

import (
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
	dec := json.NewDecoder(strings.NewReader(string(data)))
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
