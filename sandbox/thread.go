package sandbox

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// startParked runs start on a thread of its own (onOwnThread) and, once it succeeded,
// keeps that thread parked until release is called: the kernel delivers
// SysProcAttr.Pdeathsig when the forking thread ends, not the process, so release must
// wait until the child has been reaped. Both Group.Start and StartHelper fork this way.
func startParked(start func() error) (release func(), err error) {
	type result struct {
		err     error
		release chan struct{}
	}
	res := make(chan result, 1)
	onOwnThread(func() {
		if err := start(); err != nil {
			res <- result{err: err}
			return
		}
		r := make(chan struct{})
		res <- result{release: r}
		<-r
	})
	r := <-res
	if r.err != nil {
		return nil, r.err
	}
	return sync.OnceFunc(func() { close(r.release) }), nil
}

// onOwnThread runs fn in a new goroutine locked to an OS thread that is not the
// process's main thread, and never unlocks it, so the thread ends with fn's goroutine:
// whatever fn changes on it (namespaces, capabilities, cgroups) goes with it.
func onOwnThread(fn func()) {
	go func() {
		runtime.LockOSThread()
		offMainThread(fn)
	}()
}

// offMainThread runs fn on the calling goroutine, which must be locked to its thread,
// unless that thread is the process's main thread: then on a new goroutine locked to
// another thread. Either way fn's thread stays locked and ends when its goroutine does.
//
// The main thread must never be the one: the runtime cannot end it, so it parks a main
// thread whose goroutine exited locked for good instead. A namespace entered there would
// outlive the instance (a private /tmp would keep the space's disk mounted, its loop
// device attached, for the life of the box), and /proc/self, which is the main thread's
// view, would show the box that namespace. So the caller keeps the main thread locked,
// and with it out of reach, until fn's goroutine holds a thread of its own, then lets it
// go untouched.
func offMainThread(fn func()) {
	if unix.Gettid() != unix.Getpid() {
		fn()
		return
	}
	locked := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(locked)
		fn()
	}()
	<-locked
	runtime.UnlockOSThread()
}
