package lchatcli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/internal/selfcmd"
	"github.com/lchat/lchat-caddy/modules/lchat"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/sandbox"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "dev",
		Usage: "[--dir <dir>] [--listen <addr>] [--admin <addr>] [--idle-timeout <d>] [--log-level <l>] [--log-format auto|console|json]",
		Short: "Runs a local lchat box with a demo space, no setup needed",
		Long: `
Runs lchat-caddy for local development: the bucket is a directory (lchat-dev in
Caddy's data directory unless --dir, so nothing lands in the current directory),
HTTP is served on localhost:8080 (--listen), the kind "demo" runs the demo
space (lchat-demo-space next to this binary, else its demo-space alias; with
socket activation where this box can start PID namespaces), the space demo.localhost is created on first run, and the operator's
console is served at console.localhost on the same port. Ctrl-C puts every awake
space to sleep (its state saved in the bucket) and exits.

Run as root, the demo space runs under a uid of its own (isolation): dev makes its
directory searchable (0711) for that uid; every directory above it, and the binary,
must be reachable too. When the space cannot be isolated, the first lines dev prints
say why. The commands it prints name this binary as you invoked it (or go run and
the package, for a go run build).

It prints what it runs first, then logs on stderr: warnings and errors only
(--log-level info for every wake and sleep, debug for the admin API's requests),
human-readable in a terminal, JSON lines otherwise (--log-format).
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("dir", "", "Directory for the bucket, registry and instance state (default: lchat-dev in Caddy's data directory)")
			cmd.Flags().String("listen", "localhost:8080", "HTTP listen address")
			cmd.Flags().String("admin", caddy.DefaultAdminListen, "Admin API address (the CLI subcommands talk to it)")
			cmd.Flags().String("idle-timeout", "2m", "Idle time before a demo space sleeps")
			cmd.Flags().String("log-level", "warn", "Lowest level logged: debug, info, warn or error (the admin API's requests are logged at debug)")
			cmd.Flags().String("log-format", "auto", "auto (console in a terminal, else json), console or json")
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
// under dir, the kind "demo" running the demo space ({demo_space}, socket-activated
// where this box can start PID namespaces), and one plain-HTTP
// server that sends every host through the lchat handler.
func DevConfig(dir, listen, admin, idleTimeout string, logs DevLogs) ([]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	demo := map[string]any{
		"command":      "{demo_space}",
		"idle_timeout": idleTimeout,
		"ready_path":   "/healthz",
		"replication":  map[string]any{"class": "periodic", "interval": "10s"},
		"wake_path":    "/",
		// The room's WebSockets and event stream are held by the box, so an open tab
		// does not keep the space awake (docs/connections.md).
		"env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"},
	}
	if _, err := sandbox.CheckPIDNamespace(); err == nil {
		// The socket passed to the room: a wake answers as soon as it accepts.
		demo["socket_activation"] = true
	}
	if os.Geteuid() != 0 {
		// A developer's own user cannot switch uids: the explicit opt-out, so the
		// start-up log says so instead of looking for capabilities.
		demo["isolation"] = "none"
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": admin},
		"logging": logs.config(),
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
						"listen": []string{listen},
						// Plain HTTP/1.1: without TLS, HTTP/2 is skipped anyway, with a
						// warning on every start.
						"protocols":       []string{"h1"},
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

// DevLogs is how `dev` logs: Level is the lowest level written (Caddy's names: debug,
// info, warn, error); Format is "console" or "json".
type DevLogs struct{ Level, Format string }

// config is Caddy's logging config for l: the default log at l.Level, except the admin
// API's log ("admin.api", a line with every request's headers at info: each CLI command
// and console poll) which shows its requests only at debug. Both leave out Caddy's
// "exiting; byeee!! 👋", a warning on every Ctrl-C (DropEncoder).
func (l DevLogs) config() map[string]any {
	wrapped := map[string]any{"format": l.Format}
	if l.Format == "console" {
		wrapped["time_format"] = "wall_milli"
	}
	enc := map[string]any{"format": "lchat_drop", "wrap": wrapped, "messages": []string{exitMessage}}
	adminLevel := l.Level
	if strings.ToLower(l.Level) != "debug" {
		adminLevel = "warn"
		if lv := strings.ToLower(l.Level); lv == "error" || lv == "fatal" || lv == "panic" {
			adminLevel = lv
		}
	}
	return map[string]any{"logs": map[string]any{
		"default": map[string]any{
			"writer": map[string]any{"output": "stderr"}, "encoder": enc, "level": l.Level,
			"exclude": []string{"admin.api"},
		},
		"admin": map[string]any{
			"writer": map[string]any{"output": "stderr"}, "encoder": enc, "level": adminLevel,
			"include": []string{"admin.api"},
		},
	}}
}

// devLogs reads --log-level and --log-format; stderrTerminal says whether "auto" is
// console.
func devLogs(level, format string, stderrTerminal bool) (DevLogs, error) {
	switch strings.ToLower(level) {
	case "debug", "info", "warn", "error":
	default:
		return DevLogs{}, cli.Usagef("--log-level %q: want debug, info, warn or error", level)
	}
	switch format {
	case "auto":
		format = "json"
		if stderrTerminal {
			format = "console"
		}
	case "console", "json":
	default:
		return DevLogs{}, cli.Usagef("--log-format %q: want auto, console or json", format)
	}
	return DevLogs{Level: strings.ToLower(level), Format: format}, nil
}

// isTerminal reports whether f is a terminal (as Caddy decides for its default log).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// makeDevDir creates dev's directory, private to this user (0700). As root it is 0711
// instead, searchable though not listable (as the engine's state directories are): the
// demo space's own uid must get through it to its state directory, or the engine runs
// the space without isolation (engine.WhyNotIsolated). A directory that exists is made
// searchable the same way, its other bits kept.
func makeDevDir(dir string) error {
	root := os.Geteuid() == 0
	mode := os.FileMode(0o700)
	if root {
		mode = 0o711
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return fmt.Errorf("creating %s: %v", dir, err)
	}
	if !root {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if perm := fi.Mode().Perm(); perm&0o011 != 0o011 {
		if err := os.Chmod(dir, perm|0o011); err != nil {
			return fmt.Errorf("making %s searchable for the spaces' uids: %v", dir, err)
		}
	}
	return nil
}

func cmdDev(fs caddycmd.Flags) (int, error) {
	caddy.TrapSignals()
	dir, listen, admin := fs.String("dir"), fs.String("listen"), fs.String("admin")
	if dir == "" {
		dir = filepath.Join(caddy.AppDataDir(), "lchat-dev")
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return cli.ExitUsage, cli.Usagef("--listen %s: %v", listen, err)
	}
	logs, err := devLogs(fs.String("log-level"), fs.String("log-format"), isTerminal(os.Stderr))
	if err != nil {
		return cli.ExitUsage, err
	}
	if err := makeDevDir(dir); err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	cfgJSON, err := DevConfig(dir, listen, admin, fs.String("idle-timeout"), logs)
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
	b := appIface.(*lchat.App).Box()
	if _, ok := b.Lookup(demoHost); !ok {
		if _, err := b.Create(context.Background(), registry.Spec{Host: demoHost, Kind: "demo"}); err != nil {
			return caddy.ExitCodeFailedStartup, fmt.Errorf("creating %s: %v", demoHost, err)
		}
	}
	// As root the demo space is meant to run isolated; when it cannot, the reason is the
	// first thing dev prints (the start-up log has it too, at info level, among much else).
	var notIsolated error
	if os.Geteuid() == 0 {
		notIsolated = b.Engine().WhyNotIsolated("demo")
	}
	abs, _ := filepath.Abs(dir)
	exe, _ := os.Executable()
	devBanner(os.Stdout, banner{
		Self: selfcmd.Command(), GoRun: selfcmd.GoRun(exe), Dir: abs, Port: port, Admin: admin,
		Suggest:     freeHost(func(h string) bool { _, ok := b.Lookup(h); return ok }),
		NotIsolated: notIsolated, Helpers: missingHelpers(exe),
		LogLevel: logs.Level,
	})
	select {}
}
