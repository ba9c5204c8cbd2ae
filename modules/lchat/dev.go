package lchat

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "dev",
		Usage: "[--dir <dir>] [--listen <addr>] [--admin <addr>]",
		Short: "Runs a local lchat box with a demo space, no setup needed",
		Long: `
Runs lchat-caddy for local development: the bucket is a directory (lchat-dev in
Caddy's data directory unless --dir, so nothing lands in the current directory),
HTTP is served on localhost:8080 (--listen), the kind "demo" runs this binary's
demo-space, the space demo.localhost is created on first run, and the operator's
console is served at console.localhost on the same port. Ctrl-C puts every awake
space to sleep (its state saved in the bucket) and exits.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("dir", "", "Directory for the bucket, registry and instance state (default: lchat-dev in Caddy's data directory)")
			cmd.Flags().String("listen", "localhost:8080", "HTTP listen address")
			cmd.Flags().String("admin", caddy.DefaultAdminListen, "Admin API address (the CLI subcommands talk to it)")
			cmd.Flags().String("idle-timeout", "2m", "Idle time before a demo space sleeps")
			cli.Command(cmd, cobra.NoArgs, cmdDev)
		},
	})
}

// demoHost is the space `dev` creates on first run; consoleHost serves the console.
const (
	demoHost    = "demo.localhost"
	consoleHost = "console.localhost"
)

// DevConfig is the config `lchat-caddy dev` runs: a file bucket, registry and state
// under dir, the kind "demo" running this binary's demo-space, and one plain-HTTP
// server that sends every host through the lchat handler.
func DevConfig(dir, listen, admin, idleTimeout string) ([]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	demo := map[string]any{
		"command":      "{self}",
		"args":         []string{"demo-space"},
		"idle_timeout": idleTimeout,
		"ready_path":   "/healthz",
		"replication":  map[string]any{"class": "periodic", "interval": "10s"},
		"wake_path":    "/",
	}
	if os.Geteuid() != 0 {
		// A developer's own user cannot switch uids: the explicit opt-out, so the
		// start-up log says so instead of looking for capabilities.
		demo["isolation"] = "none"
	}
	cfg := map[string]any{
		"admin": map[string]any{"listen": admin},
		"storage": map[string]any{
			"module": "file_system",
			"root":   filepath.Join(abs, "caddy"),
		},
		"apps": map[string]any{
			"lchat": map[string]any{
				"bucket":             map[string]any{"backend": "file", "root": filepath.Join(abs, "bucket")},
				"state_dir":          filepath.Join(abs, "state"),
				"registry":           filepath.Join(abs, "registry.db"),
				"kinds":              map[string]any{"demo": demo},
				"wake_scan_interval": "10s",
			},
			"http": map[string]any{
				// Bounded, like the shipped Caddyfiles: an open stream must not hold
				// Ctrl-C forever (Caddy's default grace period is eternal).
				"grace_period": "10s",
				"servers": map[string]any{
					"dev": map[string]any{
						"listen":          []string{listen},
						"automatic_https": map[string]any{"disable": true},
						"routes": []any{
							map[string]any{
								"match":    []any{map[string]any{"host": []string{consoleHost}}},
								"handle":   []any{map[string]any{"handler": "lchat_console", "actions": true, "sample_interval": "10s"}},
								"terminal": true,
							},
							map[string]any{"handle": []any{map[string]any{"handler": "lchat"}}},
						},
					},
				},
			},
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

func cmdDev(fs caddycmd.Flags) (int, error) {
	caddy.TrapSignals()
	dir, listen, admin := fs.String("dir"), fs.String("listen"), fs.String("admin")
	if dir == "" {
		dir = filepath.Join(caddy.AppDataDir(), "lchat-dev")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("creating %s: %v", dir, err)
	}
	cfgJSON, err := DevConfig(dir, listen, admin, fs.String("idle-timeout"))
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("starting: %v", err)
	}
	appIface, err := caddy.ActiveContext().AppIfConfigured("lchat")
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	app := appIface.(*App)
	if _, ok := app.box.Lookup(demoHost); !ok {
		if _, err := app.box.Create(context.Background(), registry.Spec{Host: demoHost, Kind: "demo"}); err != nil {
			return caddy.ExitCodeFailedStartup, fmt.Errorf("creating %s: %v", demoHost, err)
		}
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("--listen %s: %v", listen, err)
	}
	abs, _ := filepath.Abs(dir)
	fmt.Printf(`
lchat-caddy dev is running (state in %s)

  demo space:   http://%s:%s/
  console:      http://%s:%s/
  admin API:    http://%s/lchat/status

Add a space:    lchat-caddy add-instance chat.localhost --kind demo --address %s
                then open http://chat.localhost:%s/
List routes:    lchat-caddy routes --address %s

Ctrl-C saves every awake space to the bucket and exits.

`, abs, demoHost, port, consoleHost, port, admin, admin, port, admin)
	select {}
}
