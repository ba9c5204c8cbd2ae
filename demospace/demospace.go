// Package demospace is the demo app a hibernating space runs: a chat room on
// SQLite that listens on a Unix socket, keeps its state in one data
// directory, streams new messages to browsers (server-sent events and
// WebSocket), and can ask to be woken at a time (reminders) through
// $LCHAT_DATA_DIR/.lchat/next-wake. `lchat-demo-space` (and its alias
// `lchat-caddy demo-space`) runs it; Main is their command line.
package demospace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Config says where a demo space lives.
type Config struct {
	// Socket is the Unix socket to listen on ($LCHAT_SOCKET). A stale socket
	// file is removed first. Required without Listener.
	Socket string
	// Listener, when set, is served instead of listening on Socket: the one passed
	// under socket activation (PassedListener). Close closes it and removes no file.
	Listener net.Listener
	// DataDir holds chat.db and .lchat/next-wake ($LCHAT_DATA_DIR). Created if
	// missing. Required.
	DataDir string
	// Host is the space's hostname, shown on the page ($LCHAT_HOST).
	Host string
	// Keepalive is the interval of keepalive comments (SSE) and pings
	// (WebSocket) on live connections. Default: 15s.
	Keepalive time.Duration
	// Logger defaults to a no-op logger.
	Logger *zap.Logger
	// Hold asks the box to hold the room's WebSockets and resume its event stream
	// across sleeps ($DEMO_HOLD_CONNECTIONS=1; docs/connections.md), so they do not keep
	// the space awake. Default off: the streams stay the instance's.
	Hold bool
	// ControlSocket is the box's control endpoint ($LCHAT_CONTROL_SOCKET), used with Hold.
	ControlSocket string

	clock clock // tests drive time; default realClock
}

// DefaultKeepalive is the default Config.Keepalive.
const DefaultKeepalive = 15 * time.Second

// shutdownTimeout bounds a graceful stop: in-flight requests get this long
// before connections are cut and the database is closed.
const shutdownTimeout = 5 * time.Second

// Server is one running demo space.
type Server struct {
	dataDir   string
	host      string
	keepalive time.Duration
	logger    *zap.Logger
	clock     clock
	started   time.Time

	hold    bool
	control *http.Client // the box's control endpoint; nil without Hold
	store   *store
	ln      net.Listener
	srv     *http.Server
	hub     hub
	streams streamGroup
	// done is closed when shutdown begins; live streams end on it.
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error

	// writeMu serializes writes and their publication, so subscribers see
	// message ids in increasing order. It guards the fields below.
	writeMu sync.Mutex
	timer   timer
	closed  bool
}

// New opens the database, then listens on the socket: once New returns, the
// socket accepts and every endpoint works. Call Serve, or Close on failure.
func New(cfg Config) (*Server, error) {
	if cfg.Socket == "" && cfg.Listener == nil {
		return nil, errors.New("no socket: set --socket or LCHAT_SOCKET, or pass a listener as fd 3 (LISTEN_FDS=1)")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("no data directory: set --data-dir or LCHAT_DATA_DIR")
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.clock == nil {
		cfg.clock = realClock{}
	}
	// Owner only: the room's database and the socket are nobody else's business.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data directory: %v", err)
	}
	s := &Server{
		dataDir:   cfg.DataDir,
		host:      cfg.Host,
		keepalive: cfg.Keepalive,
		logger:    cfg.Logger,
		clock:     cfg.clock,
		started:   cfg.clock.Now(),
		done:      make(chan struct{}),
		hold:      cfg.Hold,
	}
	if cfg.Hold {
		s.control = newControlClient(cfg.ControlSocket)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := openStore(ctx, filepath.Join(cfg.DataDir, DBFile))
	if err != nil {
		return nil, err
	}
	s.store = st
	s.writeMu.Lock()
	err = s.rescheduleLocked(ctx)
	s.writeMu.Unlock()
	if err != nil {
		s.closeStore()
		return nil, err
	}
	ln := cfg.Listener
	if ln == nil {
		if ln, err = listenUnix(cfg.Socket); err != nil {
			s.closeStore()
			return nil, err
		}
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          zap.NewStdLog(s.logger.Named("http")),
	}
	return s, nil
}

// listenUnix listens on path after removing a stale socket left by a process
// that died. A socket something still answers on is not taken over, and a
// path that is not a socket is never removed.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating socket directory: %v", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("checking socket: %v", err)
	case fi.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("socket path %s exists and is not a socket", path)
	default:
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket: %v", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening: %v", err)
	}
	// The proxy runs as this user; with a loose umask, others could connect too.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting socket: %v", err)
	}
	return ln, nil
}

// Serve answers requests until ctx is done, then shuts down gracefully: stop
// accepting, end live streams, let in-flight requests finish, close the
// database (checkpointing its WAL) and remove the socket. It returns nil
// after a clean shutdown.
func (s *Server) Serve(ctx context.Context) error {
	s.logger.Info("demo space serving",
		zap.String("socket", s.ln.Addr().String()),
		zap.String("data_dir", s.dataDir),
		zap.String("host", s.host))
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	err := s.Close()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serving: %v", serveErr)
	}
	return err
}

// Close shuts the server down as Serve does on cancellation. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if s.srv != nil {
			if err := s.srv.Shutdown(ctx); err != nil {
				s.logger.Warn("requests still open at shutdown; closing them", zap.Error(err))
				s.srv.Close()
			}
		}
		// Serve may never have run; Shutdown only closes listeners it served.
		s.ln.Close()
		if err := s.streams.closeAndWait(ctx); err != nil {
			s.logger.Warn("websockets still open at shutdown", zap.Error(err))
		}
		s.closeErr = s.closeStore()
		s.logger.Info("demo space stopped")
	})
	return s.closeErr
}

// closeStore stops the reminder timer and closes the database.
func (s *Server) closeStore() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if err := s.store.Close(); err != nil {
		return fmt.Errorf("closing database: %v", err)
	}
	return nil
}

// Run serves cfg until ctx is done; see New and Serve.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}
