package connhold

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// Doer sends one HTTP request and returns its answer (an *http.Client, or an
// EventClient).
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// EventClient is an HTTP/1.1 client for one instance's Unix socket that sends a request
// and reads its answer on the calling goroutine, over a kept-alive connection. It is what
// net/http's Transport does for the event POST, without the Transport's two goroutines
// per connection and the channel hand-offs between them and the caller on every request:
// on the awake path those hand-offs were a large share of an event's round trip. The
// requests are the same HTTP/1.1 requests (http.Request.Write).
type EventClient struct {
	// Socket is the Unix socket the client dials.
	Socket string
	// MaxIdle is how many idle connections are kept; default 4.
	MaxIdle int
	// HeaderTimeout bounds the wait for an answer's header; default 2 minutes.
	HeaderTimeout time.Duration

	mu     sync.Mutex
	idle   []*eventConn
	closed bool
}

type eventConn struct {
	nc    net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	since time.Time // when it went idle
}

// freshIdle is how long a connection may have been idle and still be reused without
// asking the kernel whether the instance closed it: no HTTP server closes an idle
// connection that soon (Go's keeps them, Node's after 5 s, gunicorn's after 2 s), and a
// connection the instance did close in between (it ended: DropIdle closes those) fails
// the event, which is delivered again. It saves a system call on each event of a busy
// connection.
const freshIdle = 500 * time.Millisecond

// Do sends req (its URL's host is the Host header; the address is Socket) and returns the
// answer. The answer's body must be closed; a connection goes back to the idle set once its
// answer's body was read to its end and closed. A request on a reused connection that
// fails is not sent again (an event POST is not idempotent: the caller marks it a
// redelivery).
//
// An answer counts whenever it comes: an instance may answer before it has read the whole
// body (or without reading it at all), and then stop reading or close the connection (Go's
// server closes it past 256 KiB unread). A body over inlineBody is therefore written on a
// goroutine of its own while the answer is read; a connection whose body was not taken
// whole is not reused.
func (ec *EventClient) Do(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	c, err := ec.get(ctx)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	resp, wrote, err := ec.roundTrip(c, req)
	if err != nil {
		stop()
		c.nc.Close()
		if wrote != nil {
			<-wrote // the writer ends on the closed connection
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	resp.Body = &eventBody{ReadCloser: resp.Body, ec: ec, c: c, stop: stop, keep: !resp.Close, wrote: wrote}
	return resp, nil
}

// inlineBody is the largest request body written on the calling goroutine before the
// answer is read: it fits in the socket's send buffer, so the write returns whether or not
// the instance reads it. A larger one may not (an instance that answers without reading
// it), and is written beside the read.
const inlineBody = 32 << 10

// roundTrip writes req and reads its answer's header. wrote, when not nil, receives the
// result of the request's write, which runs beside the read, once it ends.
func (ec *EventClient) roundTrip(c *eventConn, req *http.Request) (resp *http.Response, wrote chan error, err error) {
	timeout := ec.HeaderTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	if err := c.nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, nil, err
	}
	if req.ContentLength >= 0 && req.ContentLength <= inlineBody {
		if err := writeRequest(c, req); err != nil {
			return nil, nil, err
		}
		resp, err := http.ReadResponse(c.br, req)
		return resp, nil, err
	}
	wrote = make(chan error, 1)
	safego.Go(nil, nil, "connhold event body", func() {
		err := errors.New("writing the event panicked")
		defer func() { wrote <- err }()
		err = writeRequest(c, req)
	})
	resp, err = http.ReadResponse(c.br, req)
	return resp, wrote, err
}

func writeRequest(c *eventConn, req *http.Request) error {
	if err := req.Write(c.bw); err != nil {
		return err
	}
	return c.bw.Flush()
}

// get is an idle connection that the instance has not closed, or a new one.
func (ec *EventClient) get(ctx context.Context) (*eventConn, error) {
	for {
		ec.mu.Lock()
		n := len(ec.idle)
		if n == 0 {
			ec.mu.Unlock()
			break
		}
		c := ec.idle[n-1]
		ec.idle[n-1] = nil
		ec.idle = ec.idle[:n-1]
		ec.mu.Unlock()
		if time.Since(c.since) < freshIdle || alive(c) {
			return c, nil
		}
		c.nc.Close()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", ec.Socket)
	if err != nil {
		return nil, err
	}
	return &eventConn{nc: nc, br: bufio.NewReaderSize(nc, 4096), bw: bufio.NewWriterSize(nc, 4096)}, nil
}

// alive reports whether an idle connection is still open: the instance closes an idle
// connection (its idle timeout, or its exit) without a word, and net/http's Transport
// learns of it from the read it keeps pending. A peek that would block means open.
func alive(c *eventConn) bool {
	if c.br.Buffered() > 0 {
		return false // bytes nobody asked for: not a connection to reuse
	}
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = errors.Is(err, syscall.EAGAIN)
		return true
	})
	return err == nil && open
}

func (ec *EventClient) put(c *eventConn) {
	max := ec.MaxIdle
	if max <= 0 {
		max = 4
	}
	ec.mu.Lock()
	if ec.closed || len(ec.idle) >= max {
		ec.mu.Unlock()
		c.nc.Close()
		return
	}
	c.since = time.Now()
	ec.idle = append(ec.idle, c)
	ec.mu.Unlock()
	c.nc.SetDeadline(time.Time{})
}

// DropIdle closes the idle connections and keeps serving: the instance behind them has
// ended (a sleep or a crash), and an idle connection to it would hold a descriptor in the
// box until the space's next event.
func (ec *EventClient) DropIdle() {
	ec.mu.Lock()
	idle := ec.idle
	ec.idle = nil
	ec.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

// Idle is how many idle connections the client keeps.
func (ec *EventClient) Idle() int {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	return len(ec.idle)
}

// CloseIdleConnections closes the idle connections; later ones are closed as they go idle.
func (ec *EventClient) CloseIdleConnections() {
	ec.mu.Lock()
	idle := ec.idle
	ec.idle, ec.closed = nil, true
	ec.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

// eventBody gives the connection back once the answer's body was read to its end, and
// the request's body was written whole.
type eventBody struct {
	io.ReadCloser
	ec    *EventClient
	c     *eventConn
	stop  func() bool
	keep  bool
	wrote chan error // the request's writer, when it ran beside the read
	eof   bool
	done  bool
}

func (b *eventBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *eventBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	err := b.ReadCloser.Close()
	written := true
	if b.wrote != nil {
		select {
		case werr := <-b.wrote:
			written = werr == nil
		default:
			// The writer has not returned: it has just taken the last bytes, or the
			// instance is not taking the rest. A deadline now tells which.
			b.c.nc.SetWriteDeadline(time.Unix(1, 0))
			written = <-b.wrote == nil
		}
	}
	if b.stop() && b.keep && b.eof && written && err == nil {
		b.ec.put(b.c)
		return err
	}
	b.c.nc.Close()
	return err
}

// Interface guards
var (
	_ Doer = (*EventClient)(nil)
	_ Doer = (*http.Client)(nil)
)
