package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/sandbox"
)

// Socket activation (Kind.SocketActivation, docs/socket-activation.md): the box binds and
// listens on the space's socket in its own proxy directory before it starts the instance
// and passes the listener as systemd does (fd 3, LISTEN_FDS=1, LISTEN_FDNAMES=http,
// LISTEN_PID=1: the instance is pid 1 of its own PID namespace). The first request waits
// in the kernel's accept queue until the app accepts, so a wake proxies at once after the
// exec instead of polling for readiness.

// activationBacklog is the listener's accept queue: a storm's requests all wait in it
// while the instance starts (the kernel caps it at net.core.somaxconn).
const activationBacklog = 4096

// listenFD is the descriptor the listener has in the instance.
const listenFD = 3

// checkActivation refuses a socket-activated kind this box cannot start as pid 1 of its
// own PID namespace. An isolated kind needs CAP_SYS_ADMIN: the unprivileged user
// namespace a box without it falls back to cannot switch uids.
func (e *Engine) checkActivation(k Kind) error {
	if !k.SocketActivation {
		return nil
	}
	ns, err := sandbox.CheckPIDNamespace()
	if err != nil {
		return fmt.Errorf("socket_activation: %v", err)
	}
	if ns.User && e.isolated(k) {
		return errors.New("socket_activation: an isolated kind needs CAP_SYS_ADMIN (a PID namespace per instance, under the space's uid); this box has only unprivileged user namespaces (isolation none, or grant CAP_SYS_ADMIN)")
	}
	return nil
}

// listenActivated binds and listens on the space's socket, the box's own file in the
// box's proxy directory (0700), and returns the listener as a file to pass to the
// instance. The box closes its copy once the instance has it, so the listener closes
// when the instance's last process exits: a request then is refused, never queued
// for nobody.
func (in *inst) listenActivated() (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(in.link), 0o700); err != nil {
		return nil, err
	}
	if err := os.Remove(in.link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket: %v", err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating socket: %v", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: in.link}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding %s: %v", in.link, err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, in.link, 0o600, 0); err != nil {
		unix.Close(fd)
		os.Remove(in.link)
		return nil, fmt.Errorf("restricting %s: %v", in.link, err)
	}
	if err := unix.Listen(fd, activationBacklog); err != nil {
		unix.Close(fd)
		os.Remove(in.link)
		return nil, fmt.Errorf("listening on %s: %v", in.link, err)
	}
	return os.NewFile(uintptr(fd), in.link), nil
}

// activationEnv is what a socket-activated instance learns of its listener: the names
// sd_listen_fds(3) reads.
func activationEnv() []string {
	return []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=http", "LISTEN_PID=1"}
}

// errNoFirstAnswer is why a socket-activated instance that never answered was killed.
var errNoFirstAnswer = errors.New("never answered on the socket passed to it (fd 3, LISTEN_FDS=1) within ready_timeout: does it take a passed listener?")

// watchFirstAnswer runs off the wake's path, once per socket-activated start: it sends the
// readiness probe on the box's listener (instanceClient.ready: GET ReadyPath, else
// "OPTIONS *", whose answer is any status) until it answers or ReadyTimeout passes. An instance that ignores the
// passed socket (or never gets ready) is killed then, and its exit is a crash with that
// reason; one that exits first is a crash already (onExit).
func (e *Engine) watchFirstAnswer(in *inst, p *proc, kind Kind) {
	ctx, cancel := context.WithTimeout(e.ctx, kind.ReadyTimeout)
	defer cancel()
	safego.Go(nil, e.log, "first answer exit", func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	})
	client := newInstanceClient(in.link, 0)
	defer client.Close()
	delay := firstAnswerBackoff.Next(0)
	for {
		if client.ready(ctx, kind.ReadyPath, true) {
			p.answered.Store(true)
			return
		}
		select {
		case <-ctx.Done():
			if p.done() || e.ctx.Err() != nil {
				return
			}
			p.exitWhy.Store(&errNoFirstAnswer)
			in.logger().Error("instance never answered; killing it", zap.Error(errNoFirstAnswer),
				zap.Int("pid", p.pid), zap.Duration("ready_timeout", kind.ReadyTimeout))
			p.kill()
			return
		case <-time.After(delay):
		}
		delay = firstAnswerBackoff.Next(delay)
	}
}

// stopSignalFutile reports whether sig cannot stop p: p is pid 1 of its own PID
// namespace and has no handler for sig, so the kernel drops it (the default action
// would have ended a process anywhere else).
func (p *proc) stopSignalFutile(sig syscall.Signal) bool {
	if !p.pidNS {
		return false
	}
	caught, err := sandbox.SignalCaught(p.pid, sig)
	return err == nil && !caught
}
