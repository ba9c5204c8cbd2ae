package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// proc is one running instance process, in its own process group.
type proc struct {
	cmd      *exec.Cmd
	pid      int
	exited   chan struct{} // closed when the process has been reaped
	stopping atomic.Bool   // set before the engine stops it, so the exit is not a crash

	// mu orders signals against the reap: once the leader is reaped, its pid (the
	// group's id) may be reused by an unrelated process, so nothing is signalled after.
	mu     sync.Mutex
	reaped bool
}

// signal sends sig to the instance's whole process group, unless it has been reaped.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.cmd.Process.Signal(sig)
	}
}

// reap waits for the leader to exit, kills what is left of its group while the leader
// is still unreaped (its pid, the group's id, cannot be reused before the reap), then
// reaps it. Children left in the group must not outlive the instance, whether it was
// stopped or crashed, and a group kill after the reap could hit a recycled group.
func (p *proc) reap() error {
	if waitUnreaped(p.pid) {
		p.mu.Lock()
		syscall.Kill(-p.pid, syscall.SIGKILL)
	} else {
		p.mu.Lock()
	}
	err := p.cmd.Wait()
	p.reaped = true
	p.mu.Unlock()
	close(p.exited)
	return err
}

func (p *proc) kill() { p.signal(syscall.SIGKILL) }

func (e *Engine) startProcess(in *inst, kind Kind, sp Space) (*proc, error) {
	if err := os.MkdirAll(filepath.Dir(in.socket), 0o700); err != nil {
		return nil, err
	}
	if err := os.Remove(in.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket: %v", err)
	}
	logf, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	env, dropped := instanceEnv(kind, sp, in.socket, in.dataDir)
	if len(dropped) > 0 {
		in.logger().Warn("route env not allowed by kind; dropped", zap.Strings("names", dropped))
	}
	cmd := exec.Command(kind.Command, kind.Args...)
	cmd.Env = env
	cmd.Dir = in.dataDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	fmt.Fprintf(logf, "--- %s starting %s (version %q)\n", time.Now().UTC().Format(time.RFC3339), kind.Name, sp.Version)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	// Not counted in e.wg: it ends when the process does, which Close does not force.
	safego.Go(nil, e.log, "process wait", func() {
		err := p.reap()
		e.onExit(in, p, err)
	})
	return p, nil
}

// awaitReady polls the socket (or ReadyPath over it) until ready, the process exits, or
// ReadyTimeout passes.
func (e *Engine) awaitReady(ctx context.Context, in *inst, p *proc, kind Kind) error {
	ctx, cancel := context.WithTimeout(ctx, kind.ReadyTimeout)
	defer cancel()
	client := &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", in.socket)
			},
			DisableKeepAlives: true,
		},
		Timeout: 2 * time.Second,
	}
	defer client.CloseIdleConnections()
	delay := 2 * time.Millisecond
	for {
		if ready(ctx, client, in.socket, kind.ReadyPath) {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("instance exited before ready: %v", p.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s", kind.ReadyTimeout)
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
}

func ready(ctx context.Context, client *http.Client, socket, path string) bool {
	if path == "" {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://instance"+path, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// stopProcess signals the instance, waits StopGrace, then kills its process group.
func (e *Engine) stopProcess(in *inst, p *proc, kind Kind) {
	if p == nil {
		return
	}
	p.stopping.Store(true)
	p.signal(kind.StopSignal)
	t := time.NewTimer(kind.StopGrace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		in.logger().Warn("instance ignored stop signal; killing", zap.Int("pid", p.pid))
		p.kill()
		<-p.exited
	}
	// The rest of the group was killed before the leader was reaped (proc.reap).
}
