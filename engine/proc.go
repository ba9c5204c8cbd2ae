package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/DeRuina/timberjack"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/sandbox"
)

// logWriter returns the space's instance log: capped at LogMaxMB and rotated, keeping
// LogBackups old files beside it, all 0600 and the box's.
func (in *inst) logWriter() *timberjack.Logger {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.logw == nil {
		os.MkdirAll(in.dir, 0o700)
		// Created here so the file is 0600 from the start (the rotation keeps the mode).
		if f, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
			f.Close()
		}
		in.logw = &timberjack.Logger{Filename: in.logPath, MaxSize: in.e.cfg.LogMaxMB, MaxBackups: in.e.cfg.LogBackups}
	}
	return in.logw
}

// proc is one running instance process, in its own process group, and in its own cgroup
// when the kind is isolated or limited.
type proc struct {
	cmd      *exec.Cmd
	pid      int
	exited   chan struct{} // closed when the process has been reaped
	stopping atomic.Bool   // set before the engine stops it, so the exit is not a crash
	group    *sandbox.Group
	isolated bool   // under the space's own uid (and so in group)
	uid      int    // the owner the instance's socket must have
	link     string // the proxy's link to the instance's socket, removed at the reap
	release  func() // frees the thread that forked the instance (sandbox.Group.Start); nil without a group
	// netRelease ends the instance's admission to the egress filter; nil: none.
	netRelease func()
	oomKills   int // set by reap before exited is closed
	// pidNS: the instance is pid 1 of its own PID namespace (socket activation), which
	// ignores the signals it has no handler for.
	pidNS bool
	// answered is set once a socket-activated instance first answered (watchFirstAnswer).
	answered atomic.Bool
	// exitWhy, when set before the instance is killed, is the crash's reason (onExit).
	exitWhy atomic.Pointer[error]

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
//
// With a cgroup, every descendant is ended instead, wherever it went (setsid, double
// fork), and the group is removed once the OOM kills it saw are read.
func (p *proc) reap() error {
	if waitUnreaped(p.pid) {
		p.mu.Lock()
		syscall.Kill(-p.pid, syscall.SIGKILL)
	} else {
		p.mu.Lock()
	}
	if p.group != nil {
		p.group.Kill()
	}
	err := p.cmd.Wait()
	p.reaped = true
	p.mu.Unlock()
	if p.group != nil {
		p.oomKills = p.group.OOMKills()
		p.group.Remove()
		p.release()
	}
	if p.netRelease != nil {
		p.netRelease() // every process of the uid is gone (the group was killed)
	}
	os.Remove(p.link) // before exited: the next wake pins its own
	close(p.exited)
	return err
}

// done reports whether the process has been reaped (its cgroup is gone then too).
func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// kill ends the instance: its cgroup when it has one, else its process group.
func (p *proc) kill() {
	if p.group != nil {
		p.group.Kill()
		return
	}
	p.signal(syscall.SIGKILL)
}

func (e *Engine) startProcess(in *inst, kind Kind, sp Space) (*proc, error) {
	plan, err := e.prepareSandbox(in, kind)
	if err != nil {
		return nil, fmt.Errorf("preparing the sandbox: %v", err)
	}
	started := false
	defer func() {
		if !started {
			plan.release()
		}
	}()
	if err := os.Remove(in.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket: %v", err)
	}
	logw := in.logWriter()
	// The instance writes into a pipe, never the file: the box rotates the file, and an
	// isolated instance gets no descriptor of a file the box owns.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close() // the child has its own descriptor
	socket := in.socket
	if kind.SocketActivation {
		socket = "" // the instance gets its listener, never a path to bind
	}
	env, dropped := instanceEnv(kind, sp, socket, ControlSocketPath(in.e.cfg.StateDir, sp.Host), in.dataDir)
	if len(dropped) > 0 {
		in.logger().Warn("route env not allowed by kind; dropped", zap.Strings("names", dropped))
	}
	cmd := exec.Command(kind.Command, kind.Args...)
	cmd.Env = env
	cmd.Dir = in.dataDir
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = sysProcAttr()
	cmd.SysProcAttr.Credential = plan.cred
	in.unpinSocket()
	if kind.SocketActivation {
		ns, err := sandbox.CheckPIDNamespace()
		if err != nil {
			return nil, fmt.Errorf("socket_activation: %v", err)
		}
		ln, err := in.listenActivated()
		if err != nil {
			return nil, err
		}
		// The box keeps no copy once the instance has its own (see listenActivated).
		defer ln.Close()
		cmd.ExtraFiles = []*os.File{ln} // fd 3 (listenFD)
		cmd.Env = append(cmd.Env, activationEnv()...)
		ns.Apply(cmd.SysProcAttr)
	}
	fmt.Fprintf(logw, "--- %s starting %s (version %q)\n", e.now().UTC().Format(time.RFC3339), kind.Name, sp.Version)
	p := &proc{cmd: cmd, exited: make(chan struct{}), group: plan.group, uid: os.Geteuid(), link: in.link, netRelease: plan.netRelease,
		pidNS: kind.SocketActivation}
	if plan.cred != nil {
		p.uid = int(plan.cred.Uid)
		p.isolated = plan.group != nil
	}
	// Checkpoints read the databases as the instance runs: under its uid when it has one.
	in.syncer.PageReader = e.pageReader(in, plan.cred)
	if plan.group != nil {
		p.release, err = plan.group.Start(cmd, sandbox.StartOptions{EmptyNetwork: plan.emptyNet, TmpDir: plan.tmpDir})
	} else {
		err = cmd.Start()
	}
	if err != nil {
		r.Close()
		if kind.SocketActivation {
			os.Remove(in.link)
		}
		return nil, err
	}
	started = true
	p.pid = cmd.Process.Pid
	safego.Go(nil, e.log, "instance log", func() {
		defer r.Close()
		// Ends when every process holding the pipe is gone. A failed write drops that
		// chunk but keeps draining, so a full disk never blocks the instance.
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				logw.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	})
	// Not counted in e.wg: it ends when the process does, which Close does not force.
	safego.Go(nil, e.log, "process wait", func() {
		err := p.reap()
		e.onExit(in, p, err)
	})
	return p, nil
}

// awaitReady sends the readiness probe (instanceClient.ready) on the socket the instance
// bound, once it is pinned, until it is ready, the process exits, or ReadyTimeout passes.
func (e *Engine) awaitReady(ctx context.Context, in *inst, p *proc, kind Kind) error {
	ctx, cancel := context.WithTimeout(ctx, kind.ReadyTimeout)
	defer cancel()
	client := newInstanceClient(in.link, 2*time.Second)
	defer client.Close()
	delay := readyBackoff.Next(0)
	for {
		switch err := in.pinSocket(p.uid); {
		case errors.Is(err, errSocketMissing):
		case err != nil:
			return err
		case client.ready(ctx, kind.ReadyPath, false):
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("instance exited before ready: %v", p.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s", kind.ReadyTimeout)
		case <-time.After(delay):
		}
		delay = readyBackoff.Next(delay)
	}
}

// stopProcess is the one way the engine ends an instance, awake (stopOpHeld) or still
// waking (a wake's undo, a start that never got ready), and returns once it is reaped.
// The exit is marked as the engine's, never a crash. stopGraceful signals StopSignal and
// kills after StopGrace (at once when the signal cannot stop it); stopKill kills at once.
func (e *Engine) stopProcess(in *inst, p *proc, kind Kind, manner stopManner) {
	if p == nil {
		return
	}
	p.stopping.Store(true)
	// What the signal's default action would have done, at once: waiting out the grace
	// for a signal the kernel drops would only delay the stop.
	if manner == stopGraceful && !p.stopSignalFutile(kind.StopSignal) {
		p.signal(kind.StopSignal)
		t := time.NewTimer(kind.StopGrace)
		defer t.Stop()
		select {
		case <-p.exited:
			return
		case <-t.C:
			in.logger().Warn("instance ignored stop signal; killing", zap.Int("pid", p.pid))
		}
	}
	p.kill()
	<-p.exited
	// The rest of the group was killed before the leader was reaped (proc.reap).
}
