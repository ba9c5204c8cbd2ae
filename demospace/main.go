package demospace

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"go.uber.org/zap"
)

// Usage is the demo space's command line, shared by lchat-demo-space and the
// `lchat-caddy demo-space` alias.
const Usage = "[--socket <path>] [--data-dir <dir>] [--host <name>]"

// Help describes the demo space's command for both binaries.
const Help = `Runs the demo space: a small chat room on SQLite that the lchat hibernation
engine runs as a real instance (kind "demo" in the shipped configs).

It serves the listener passed to it as fd 3 under socket activation
(LISTEN_FDS=1, LISTEN_PID its own pid; docs/socket-activation.md), else it
listens on the Unix socket $LCHAT_SOCKET. It keeps its data in
$LCHAT_DATA_DIR/chat.db and shows $LCHAT_HOST on its page. The flags
override the environment for manual use.

Endpoints: GET / (the page), GET|POST /api/messages, GET /api/events
(server-sent events), GET /api/ws (WebSocket), GET|POST /api/reminders,
POST /api/wake (or POST / with X-Lchat-Wake-Reason), GET /healthz.

A reminder leaves its time in $LCHAT_DATA_DIR/.lchat/next-wake so the
proxy can wake the space for it. With DEMO_HOLD_CONNECTIONS=1 the box holds
its WebSockets and resumes its event stream across sleeps, sending new
messages through $LCHAT_CONTROL_SOCKET (docs/connections.md). SIGTERM or
SIGINT stops it cleanly.`

// Main is the demo space's command: it reads args (without the program name) and the
// environment, serves until SIGTERM or SIGINT and returns nil after a clean stop. Both
// doors call it: cmd/lchat-demo-space, the small binary a wake can afford to exec, and
// `lchat-caddy demo-space`.
func Main(args []string, stderr io.Writer, logger *zap.Logger) error {
	fs := flag.NewFlagSet("demo-space", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "Unix socket to listen on (default $LCHAT_SOCKET)")
	dataDir := fs.String("data-dir", "", "Data directory (default $LCHAT_DATA_DIR)")
	host := fs.String("host", "", "Hostname shown on the page (default $LCHAT_HOST)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: demo-space %s\n\n%s\n\nFlags:\n", Usage, Help)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	cfg := Config{
		Socket:  orEnv(*socket, "LCHAT_SOCKET"),
		DataDir: orEnv(*dataDir, "LCHAT_DATA_DIR"),
		Host:    orEnv(*host, "LCHAT_HOST"),
		Logger:  logger,
		// The box holds the room's WebSockets and resumes its event stream across
		// sleeps, and the room sends new messages through the control socket
		// (docs/connections.md).
		Hold:          os.Getenv("DEMO_HOLD_CONNECTIONS") == "1",
		ControlSocket: os.Getenv("LCHAT_CONTROL_SOCKET"),
	}
	if *socket == "" {
		ln, err := PassedListener()
		if err != nil {
			return err
		}
		cfg.Listener = ln
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return Run(ctx, cfg)
}

func orEnv(v, env string) string {
	if v != "" {
		return v
	}
	return os.Getenv(env)
}

// PassedListener is the listener passed under socket activation, as sd_listen_fds(3)
// finds it: LISTEN_PID is this process and LISTEN_FDS=1 names fd 3. It returns nil
// without LISTEN_FDS, and unsets the variables so no child takes them for its own.
func PassedListener() (net.Listener, error) {
	fds, pid := os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_PID")
	if fds == "" {
		return nil, nil
	}
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDNAMES")
	if pid != strconv.Itoa(os.Getpid()) {
		return nil, fmt.Errorf("LISTEN_PID=%s is not this process (%d): the listener is not ours", pid, os.Getpid())
	}
	if fds != "1" {
		return nil, fmt.Errorf("LISTEN_FDS=%s: the demo space takes exactly one listener", fds)
	}
	f := os.NewFile(3, "http")
	defer f.Close() // FileListener holds its own descriptor
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("taking the passed listener (fd 3): %v", err)
	}
	return ln, nil
}
