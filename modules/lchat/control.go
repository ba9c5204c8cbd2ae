package lchat

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// ensureControl serves host's control endpoint (connhold.Hub.ControlHandler) on its Unix
// socket (engine.ControlSocketPath, LCHAT_CONTROL_SOCKET in the instance's environment),
// from the space's first held connection until the box closes. The socket is in a
// directory only the box writes; any uid may connect, and a caller whose uid is not the
// awake instance's (SO_PEERCRED) is hung up on: another space cannot act on this one's
// connections even knowing the path.
func (c *conns) ensureControl(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done || c.controls[host] != nil {
		return
	}
	path := engine.ControlSocketPath(c.stateDir, host)
	ln, err := listenControl(path)
	if err != nil {
		c.log.Error("serving a space's control endpoint", zap.String("host", host), zap.Error(err))
		return
	}
	var handler http.Handler = c.hub.ControlHandler(host)
	if c.box.Mesh() != nil {
		handler = &fanoutControl{c: c, host: host, local: handler}
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: zap.NewStdLog(c.log)}
	c.controls[host] = srv
	safego.Go(nil, c.log, "control endpoint", func() {
		srv.Serve(&peerListener{Listener: ln, ok: func(uid int) bool {
			want, awake := c.box.Engine().InstanceUID(host)
			return awake && uid == want
		}})
	})
}

func listenControl(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// The directory is the box's: no name in it can be swapped for a link.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// peerListener accepts only callers whose uid ok allows.
type peerListener struct {
	net.Listener
	ok func(uid int) bool
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(conn)
		if err == nil && l.ok(uid) {
			return conn, nil
		}
		conn.Close()
	}
}

func peerUID(conn net.Conn) (int, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return -1, fmt.Errorf("not a unix connection")
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// closeControls stops every control endpoint and removes its socket.
func (c *conns) closeControlsLocked() {
	for host, srv := range c.controls {
		srv.Close()
		os.Remove(engine.ControlSocketPath(c.stateDir, host))
	}
	clear(c.controls)
}
