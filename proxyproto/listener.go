package proxyproto

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goproxy "github.com/pires/go-proxyproto"
	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds the wait for a balancer's header.
const DefaultTimeout = 5 * time.Second

// Listener wraps a TCP listener: a connection from an address in Allow may open with a
// PROXY protocol header, which is read (exactly, nothing past it) before its first byte
// is handed on and whose source becomes the connection's RemoteAddr; a connection from
// any other address is handed on untouched, so a header it sends reaches TLS or HTTP as
// garbage and is refused there. A connection from an allowed address without a header
// (a peer box in the same range, a balancer's plain TCP health check) keeps its own
// address.
type Listener struct {
	net.Listener
	// Allow are the balancers' addresses. Empty: every connection is handed on untouched.
	Allow []netip.Prefix
	// Timeout bounds the wait for the header's bytes. Default DefaultTimeout.
	Timeout time.Duration
}

// Accept waits for the next connection; one from an allowed address reads its header on
// its first Read or RemoteAddr, on the goroutine that serves it, never here.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || !Allowed(l.Allow, c.RemoteAddr()) {
		return c, err
	}
	sc, ok := c.(syscallConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("proxyproto: a %T has no socket to read a header from", c)
	}
	t := l.Timeout
	if t <= 0 {
		t = DefaultTimeout
	}
	return &Conn{syscallConn: sc, timeout: t}, nil
}

// Allowed reports whether addr is in one of the prefixes.
func Allowed(allow []netip.Prefix, addr net.Addr) bool {
	if len(allow) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ParseAllow parses balancer addresses: IPs (one address) or CIDR prefixes.
func ParseAllow(specs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range specs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an IP address nor a CIDR prefix", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

type syscallConn interface {
	net.Conn
	syscall.Conn
}

// Conn is a connection from a balancer's address. Its socket is its own (SyscallConn),
// and every byte read from it after the header is the client's.
type Conn struct {
	syscallConn
	timeout time.Duration

	once   sync.Once
	remote net.Addr // the header's source, or nil: the socket's own peer
	err    error    // a header that could not be read; every Read returns it

	// deadline is the read deadline the conn's user set, put back after the header's own.
	deadline atomic.Pointer[time.Time]
}

// SetReadDeadline sets the socket's read deadline, and remembers it for after the header.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.deadline.Store(&t)
	return c.syscallConn.SetReadDeadline(t)
}

// SetDeadline sets both deadlines, and remembers the read one for after the header.
func (c *Conn) SetDeadline(t time.Time) error {
	c.deadline.Store(&t)
	return c.syscallConn.SetDeadline(t)
}

// Read reads the header first, once.
func (c *Conn) Read(b []byte) (int, error) {
	if err := c.header(); err != nil {
		return 0, err
	}
	return c.syscallConn.Read(b)
}

// RemoteAddr is the client's address from the header, else the socket's peer.
func (c *Conn) RemoteAddr() net.Addr {
	if c.header() == nil && c.remote != nil {
		return c.remote
	}
	return c.syscallConn.RemoteAddr()
}

// Header reports the client's address the header carried (nil when none), reading it
// first if need be.
func (c *Conn) Header() (net.Addr, error) {
	err := c.header()
	return c.remote, err
}

func (c *Conn) header() error {
	c.once.Do(func() {
		c.remote, c.err = c.readHeader()
		if c.err != nil {
			c.err = fmt.Errorf("reading the PROXY protocol header from %s: %w", c.syscallConn.RemoteAddr(), c.err)
		}
	})
	return c.err
}

// readHeader peeks at the first bytes until they frame a header or show there is none,
// then reads exactly the header.
func (c *Conn) readHeader() (net.Addr, error) {
	// The header's own deadline, never past the user's; the user's is put back after.
	var user time.Time
	if p := c.deadline.Load(); p != nil {
		user = *p
	}
	dl := time.Now().Add(c.timeout)
	if !user.IsZero() && user.Before(dl) {
		dl = user
	}
	if err := c.syscallConn.SetReadDeadline(dl); err != nil {
		return nil, err
	}
	defer func() {
		if p := c.deadline.Load(); p != nil {
			user = *p
		}
		c.syscallConn.SetReadDeadline(user)
	}()
	rc, err := c.syscallConn.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, v1Max+1)
	size, seen := 0, 0
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, errno := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK)
		switch {
		case errno == unix.EAGAIN || errno == unix.EINTR:
			return false
		case errno != nil:
			perr = errno
			return true
		case n == 0: // closed before a byte: no header; the reader sees EOF
			return true
		}
		seen = n
		size, perr = HeaderLen(buf[:n])
		// Short: the rest is on its way; wait for the socket's next readiness.
		return !errors.Is(perr, ErrShort)
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) && seen == 0:
		return nil, nil // a balancer's bare TCP check, or a client that sent nothing yet
	case err != nil:
		return nil, err
	case perr != nil:
		return nil, perr
	case size == 0:
		return nil, nil
	}
	hdr := make([]byte, size)
	if _, err := io.ReadFull(c.syscallConn, hdr); err != nil {
		return nil, err
	}
	h, err := goproxy.Read(bufio.NewReader(bytes.NewReader(hdr)))
	if err != nil {
		return nil, err
	}
	if h.Command.IsLocal() || h.SourceAddr == nil {
		return nil, nil // the balancer's own connection (a health check): its address stands
	}
	switch h.SourceAddr.(type) {
	case *net.TCPAddr, *net.UDPAddr:
		return h.SourceAddr, nil
	}
	return nil, nil // UNKNOWN or a Unix address: the socket's peer stands
}

// Interface guards
var (
	_ net.Listener = (*Listener)(nil)
	_ net.Conn     = (*Conn)(nil)
	_ syscall.Conn = (*Conn)(nil)
)
