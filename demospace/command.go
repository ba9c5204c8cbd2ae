package demospace

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/internal/cli"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "demo-space",
		Usage: "[--socket <path>] [--data-dir <dir>] [--host <name>]",
		Short: "Runs the demo chat room a hibernating space serves",
		Long: `
Runs the demo space: a small chat room on SQLite that the lchat hibernation
engine runs as a real instance (kind "demo" in the dev setup).

It listens on the Unix socket $LCHAT_SOCKET, keeps its data in
$LCHAT_DATA_DIR/chat.db, and shows $LCHAT_HOST on its page. The flags
override the environment for manual use.

Endpoints: GET / (the page), GET|POST /api/messages, GET /api/events
(server-sent events), GET /api/ws (WebSocket), GET|POST /api/reminders,
POST /api/wake (or POST / with X-Lchat-Wake-Reason), GET /healthz.

A reminder leaves its time in $LCHAT_DATA_DIR/.lchat/next-wake so the
proxy can wake the space for it. SIGTERM or SIGINT stops it cleanly.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("socket", "", "Unix socket to listen on (default $LCHAT_SOCKET)")
			cmd.Flags().String("data-dir", "", "Data directory (default $LCHAT_DATA_DIR)")
			cmd.Flags().String("host", "", "Hostname shown on the page (default $LCHAT_HOST)")
			cli.Command(cmd, nil, cmdDemoSpace)
		},
	})
}

func cmdDemoSpace(fl caddycmd.Flags) (int, error) {
	cfg := Config{
		Socket:  flagOrEnv(fl, "socket", "LCHAT_SOCKET"),
		DataDir: flagOrEnv(fl, "data-dir", "LCHAT_DATA_DIR"),
		Host:    flagOrEnv(fl, "host", "LCHAT_HOST"),
		Logger:  caddy.Log().Named("demo_space"),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, cfg); err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	return caddy.ExitCodeSuccess, nil
}

func flagOrEnv(fl caddycmd.Flags, flag, env string) string {
	if v := fl.String(flag); v != "" {
		return v
	}
	return os.Getenv(env)
}
