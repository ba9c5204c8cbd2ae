package engine

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// A socket-activated space's listener outlives a clean stop, as a systemd socket unit's
// outlives its service: the box parks it and passes the same socket at the next wake, so a
// wake creates no socket file. Creating one is an inode, and on a filesystem that makes
// inodes dear (ext4 without a journal scans the recently freed inodes of the group for each
// new one) binding was half of the box's filesystem CPU in a wake storm
// (docs/wake-figures.md).
//
// What "never queued for nobody" (listenActivated) needs from a parked socket:
//
//   - while the space sleeps its path does not exist (renamed to parkedPath in the box's
//     0700 proxy directory): a dial is refused at once (ENOENT), as with no socket;
//   - the connections queued when the instance ended are closed at the park, and any that
//     slipped in beside the rename at the next wake, before the socket is passed on: no
//     instance answers a request sent to an earlier one;
//   - only a stop the engine asked for, of an instance that answered on the socket and ran
//     in a cgroup, parks: the cgroup's kill leaves no descendant that could still accept
//     on it (a process group does not: setsid escapes it). A crash, a start that never
//     answered, an ungrouped instance close the socket as before;
//   - the instance had the socket to itself, so it may have shut it down or set
//     O_NONBLOCK on it (the flag is the open file's, shared with the box): the wake
//     clears the flag and connects once to check that it still listens, else it binds a
//     fresh one;
//   - at most maxParked sockets are parked per engine (one descriptor each); beyond that a
//     stop closes its socket as before.

// maxParked bounds the descriptors parked sockets hold.
const maxParked = 4096

// parkedPath is where a space's parked socket waits: beside its proxy path, never dialed.
func (in *inst) parkedPath() string { return in.link + ".parked" }

// parkedSocket is one space's parked listener.
type parkedSocket struct {
	mu sync.Mutex
	f  *os.File
}

// park keeps f, the listener of an instance that was just stopped and reaped, for the
// next wake; false (f untouched) when it cannot be parked.
func (in *inst) park(f *os.File) bool {
	e := in.e
	if e.parkedN.Add(1) > maxParked || e.ctx.Err() != nil {
		e.parkedN.Add(-1)
		return false
	}
	if err := os.Rename(in.link, in.parkedPath()); err != nil {
		e.parkedN.Add(-1)
		return false
	}
	closeQueued(f)
	in.parked.mu.Lock()
	old := in.parked.f
	in.parked.f = f
	in.parked.mu.Unlock()
	if old != nil { // not reachable: a wake takes the parked socket before it starts
		old.Close()
		e.parkedN.Add(-1)
	}
	return true
}

// unpark returns the parked listener at the space's proxy path again, checked to still
// listen and with nothing queued on it, or nil (a fresh one is to be bound).
func (in *inst) unpark() *os.File {
	in.parked.mu.Lock()
	f := in.parked.f
	in.parked.f = nil
	in.parked.mu.Unlock()
	if f == nil {
		return nil
	}
	in.e.parkedN.Add(-1)
	fd := int(f.Fd())
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		os.Remove(in.parkedPath())
		return nil
	}
	closeQueued(f)
	if err := os.Rename(in.parkedPath(), in.link); err != nil {
		f.Close()
		os.Remove(in.parkedPath())
		return nil
	}
	if !stillListening(in.link, f) {
		f.Close()
		os.Remove(in.link)
		return nil
	}
	return f
}

// discardParked closes the space's parked listener, if any, and removes its file.
func (in *inst) discardParked() {
	in.parked.mu.Lock()
	f := in.parked.f
	in.parked.f = nil
	in.parked.mu.Unlock()
	if f != nil {
		f.Close()
		in.e.parkedN.Add(-1)
	}
	os.Remove(in.parkedPath())
}

// closeQueued accepts and closes every connection waiting on the listener f: their dialers
// read EOF, as from an instance that ended. f may be blocking: accept runs only after
// poll saw a connection, and nobody else accepts on a parked socket.
func closeQueued(f *os.File) {
	fd := int(f.Fd())
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 || pfd[0].Revents&unix.POLLIN == 0 {
			return
		}
		c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if err != nil {
			return
		}
		unix.Close(c)
	}
}

// stillListening connects once to path, the socket of listener f, and takes that
// connection off f again: false when the socket no longer accepts (an instance shut it
// down).
func stillListening(path string, f *os.File) bool {
	c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(c)
	if err := unix.Connect(c, &unix.SockaddrUnix{Name: path}); err != nil {
		return false
	}
	closeQueued(f)
	return true
}
