package connhold

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// poller is the box's own epoll set of parked connections. A parked connection has no
// goroutine: its fd is registered one-shot for readability, and the poller's one loop
// starts a reader for it when bytes (or a hang-up) arrive. The fd stays in Go's netpoller
// too (its registration is edge-triggered and independent of ours), so the reader reads
// through the net.Conn as usual.
type poller struct {
	epfd   int
	wakefd int // an eventfd: written to end run

	mu sync.Mutex
	// byFD maps a registered fd to its connection. An event is checked against the
	// connection's registration generation, so an fd closed and reused meanwhile cannot
	// start a reader on the wrong connection.
	byFD map[int32]*Conn
	gen  uint32
}

func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating epoll set: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("creating eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakefd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, fmt.Errorf("registering eventfd: %w", err)
	}
	return &poller{epfd: epfd, wakefd: wakefd, byFD: make(map[int32]*Conn)}, nil
}

const parkEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// park registers c's fd (first park) or re-arms it, one-shot.
func (p *poller) park(c *Conn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fd := int32(c.fd)
	op := unix.EPOLL_CTL_MOD
	if !c.registered {
		op = unix.EPOLL_CTL_ADD
		p.gen++
		c.pollGen = p.gen
		p.byFD[fd] = c
	}
	ev := unix.EpollEvent{Events: parkEvents, Fd: fd, Pad: int32(c.pollGen)}
	if err := unix.EpollCtl(p.epfd, op, c.fd, &ev); err != nil {
		if !c.registered {
			delete(p.byFD, fd)
		}
		return fmt.Errorf("parking fd %d: %w", fd, err)
	}
	c.registered = true
	return nil
}

// remove takes c's fd out of the set; it must run before the fd is closed.
func (p *poller) remove(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !c.registered {
		return
	}
	c.registered = false
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	if p.byFD[int32(c.fd)] == c {
		delete(p.byFD, int32(c.fd))
	}
}

// run waits for parked connections to become readable and calls ready for each, until
// ctx ends (close wakes it).
func (p *poller) run(ctx context.Context, ready func(*Conn)) error {
	events := make([]unix.EpollEvent, 256)
	for ctx.Err() == nil {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("waiting on epoll: %w", err)
		}
		for _, ev := range events[:n] {
			if ev.Fd == int32(p.wakefd) {
				continue
			}
			p.mu.Lock()
			c := p.byFD[ev.Fd]
			if c != nil && uint32(ev.Pad) != c.pollGen {
				c = nil
			}
			p.mu.Unlock()
			if c != nil {
				ready(c)
			}
		}
	}
	return nil
}

// close ends run and releases the set; parked connections are closed by their owner.
func (p *poller) close() {
	var one = [8]byte{1}
	unix.Write(p.wakefd, one[:])
}

// release frees the poller's fds once run has returned.
func (p *poller) release() {
	unix.Close(p.epfd)
	unix.Close(p.wakefd)
}
