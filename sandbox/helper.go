package sandbox

import (
	"os/exec"
	"runtime"
	"sync"
)

// StartHelper starts cmd, a short-lived helper the box runs under a space's uid (its
// SysProcAttr carries the credentials), outside any space's cgroup: it stays in the box's
// own group, so freezing the space's group while the helper reads does not stop the helper.
//
// Like Group.Start it forks from a dedicated OS thread that first empties its ambient and
// inheritable capability sets, so the helper holds no capability after the uid switch and
// execve even on a box granted capabilities through systemd's AmbientCapabilities, and that
// thread stays parked until release is called, because the kernel delivers
// SysProcAttr.Pdeathsig when the forking thread ends: call release once the helper has
// been reaped.
func StartHelper(cmd *exec.Cmd) (release func(), err error) {
	type result struct {
		err     error
		release chan struct{}
	}
	res := make(chan result, 1)
	go func() {
		// Never unlocked: the Go runtime ends a thread whose goroutine exits locked, so
		// this thread's changed capabilities die with it.
		runtime.LockOSThread()
		if err := dropInheritableCaps(); err != nil {
			res <- result{err: err}
			return
		}
		if err := cmd.Start(); err != nil {
			res <- result{err: err}
			return
		}
		r := make(chan struct{})
		res <- result{release: r}
		<-r
	}()
	r := <-res
	if r.err != nil {
		return nil, r.err
	}
	return sync.OnceFunc(func() { close(r.release) }), nil
}
