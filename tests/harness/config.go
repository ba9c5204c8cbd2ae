package harness

import "encoding/json"

// Config builds the JSON config of a test box, the one builder every tests/ package
// uses: the admin endpoint and storage in the box's own directory, the lchat app with
// its bucket, state and registry, and one HTTP server that serves the peer API on the
// box's SELF host (with the mesh on) and the lchat handler for everything else.
type Config struct {
	// Listen is the HTTP server's address. Default "{$LCHAT_TEST_HTTP}" (StartBox's
	// free port).
	Listen string
	// Bucket is the lchat bucket module. Default: the S3 bucket of the box's
	// environment (S3.Env).
	Bucket map[string]any
	// Lchat holds more lchat app fields (kinds, mesh, wake_scan_interval, ...); they
	// override the defaults.
	Lchat map[string]any
	// MeshAPIHost routes requests for that host (the box's SELF host) to the peer API
	// first. Empty: no peer API.
	MeshAPIHost string
	// CertFile and KeyFile, when set, serve TLS with that certificate.
	CertFile, KeyFile string
	// Servers are more HTTP servers, by name.
	Servers map[string]any
	// Main holds more fields of the main HTTP server (keepalive_interval, ...); they
	// override the defaults.
	Main map[string]any
	// LogLevel sets the default log's level. Empty: Caddy's default.
	LogLevel string
}

// S3Bucket is the lchat bucket module for the S3 bucket and prefix of the box's
// environment (S3.Env).
func S3Bucket() map[string]any {
	return map[string]any{
		"backend": "s3", "bucket": "{env.LCHAT_HIBERNATE_BUCKET}",
		"prefix": "{env.LCHAT_HIBERNATE_PREFIX}", "use_path_style": true,
	}
}

// DemoKind is the demo space (this binary's demo-space subcommand), ready at /healthz,
// stopping within 5s, with more kind fields from extra.
func DemoKind(extra map[string]any) map[string]any {
	k := map[string]any{"command": "{self}", "args": []string{"demo-space"}, "ready_path": "/healthz", "stop_grace": "5s"}
	for key, v := range extra {
		k[key] = v
	}
	return k
}

// JSON is the config, indented.
func (c Config) JSON() string {
	if c.Listen == "" {
		c.Listen = "{$LCHAT_TEST_HTTP}"
	}
	if c.Bucket == nil {
		c.Bucket = S3Bucket()
	}
	app := map[string]any{
		"bucket":    c.Bucket,
		"state_dir": "{$LCHAT_TEST_DIR}/state",
		"registry":  "{$LCHAT_TEST_DIR}/registry.db",
	}
	for k, v := range c.Lchat {
		app[k] = v
	}
	var routes []any
	if c.MeshAPIHost != "" {
		routes = append(routes, map[string]any{
			"match":    []any{map[string]any{"host": []string{c.MeshAPIHost}}},
			"handle":   []any{map[string]any{"handler": "lchat_mesh_api"}},
			"terminal": true,
		})
	}
	routes = append(routes, map[string]any{"handle": []any{map[string]any{"handler": "lchat"}}})
	main := map[string]any{
		"listen":          []string{c.Listen},
		"automatic_https": map[string]any{"disable": true},
		"routes":          routes,
	}
	apps := map[string]any{"lchat": app}
	if c.CertFile != "" {
		main["tls_connection_policies"] = []any{map[string]any{}}
		apps["tls"] = map[string]any{"certificates": map[string]any{"load_files": []any{
			map[string]any{"certificate": c.CertFile, "key": c.KeyFile},
		}}}
	}
	for k, v := range c.Main {
		main[k] = v
	}
	servers := map[string]any{"main": main}
	for k, v := range c.Servers {
		servers[k] = v
	}
	apps["http"] = map[string]any{"servers": servers}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": "{$LCHAT_TEST_ADMIN}"},
		"storage": map[string]any{"module": "file_system", "root": "{$LCHAT_TEST_DIR}/caddy"},
		"apps":    apps,
	}
	if c.LogLevel != "" {
		cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{"level": c.LogLevel}}}
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	return string(b)
}
