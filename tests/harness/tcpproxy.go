package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TCPProxy forwards connections from a loopback port to a target address and can inject
// faults: delay new connections, refuse them, cut every open one, blackhole the link, lose
// answers, or reorder what is sent. Tests put it between a
// box and its bucket (or a DERP region) to stand in for a network that fails.
type TCPProxy struct {
	addr   string // where it listens, kept across SetClosed
	target string

	mu     sync.Mutex   // guards the fields below
	ln     net.Listener // nil while closed (SetClosed)
	delay  time.Duration
	jitter time.Duration // a random delay in [0, jitter) before each chunk sent to the target
	drop   int           // answers still to drop (DropResponses)
	down   bool
	hole   chan struct{} // non-nil while blackholed; closed when the blackhole lifts
	hold   *Held         // armed by Hold until a chunk matches
	conns  map[net.Conn]struct{}
}

// Held is one request a TCPProxy holds in flight (Hold): caught on its way to the target,
// delivered when released, as a write a paused machine sent before it stopped.
type Held struct {
	match    func([]byte) bool
	caught   chan struct{}
	release  chan struct{}
	answered chan struct{}
	relOnce  sync.Once
	ansOnce  sync.Once
}

// Caught is closed once a chunk matched and is held.
func (h *Held) Caught() <-chan struct{} { return h.caught }

// Release lets the held chunk, and what its connection sent after it, go on to the target.
// Idempotent.
func (h *Held) Release() { h.relOnce.Do(func() { close(h.release) }) }

// Answered is closed once the target answered the held request (sent, after the release, on
// a connection of its own): it reached the target and was acted on.
func (h *Held) Answered() <-chan struct{} { return h.answered }

// Hold arms the proxy to hold the next chunk a client sends that match reports true for
// (the start of an HTTP request, say), with everything after it on that connection, until
// the returned Held is released. Other connections are not held. The test's end releases it.
func (p *TCPProxy) Hold(match func(chunk []byte) bool) *Held {
	h := &Held{match: match, caught: make(chan struct{}), release: make(chan struct{}), answered: make(chan struct{})}
	p.mu.Lock()
	p.hold = h
	p.mu.Unlock()
	return h
}

// catch reports the armed hold if chunk matches it, disarming it.
func (p *TCPProxy) catch(chunk []byte) *Held {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == nil || !p.hold.match(chunk) {
		return nil
	}
	h := p.hold
	p.hold = nil
	return h
}

// link is what the two directions of one proxied connection share.
type link struct {
	client net.Conn // read directly only by the client-to-target pipe's goroutine
}

// StartTCPProxy listens on 127.0.0.1:0 and forwards to target until the test ends.
func StartTCPProxy(t testing.TB, target string) *TCPProxy {
	t.Helper()
	return StartTCPProxyOn(t, "127.0.0.1", target)
}

// StartTCPProxyOn is StartTCPProxy listening on ip (a free port).
func StartTCPProxyOn(t testing.TB, ip, target string) *TCPProxy {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	p := &TCPProxy{addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve(ln)
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's listening address (host:port).
func (p *TCPProxy) Addr() string { return p.addr }

// SetClosed(true) stops listening and cuts every open connection: a dial to the proxy's
// address is refused, as to a machine where nothing listens (its process killed), not
// accepted and closed as SetDown does. SetClosed(false) listens on the same address again.
func (p *TCPProxy) SetClosed(closed bool) error {
	p.mu.Lock()
	ln := p.ln
	if closed {
		p.ln = nil
	}
	p.mu.Unlock()
	if closed {
		if ln != nil {
			ln.Close()
		}
		p.SetDown(true)
		return nil
	}
	if ln == nil {
		nl, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("listening on %s again: %w", p.addr, err)
		}
		p.mu.Lock()
		p.ln = nl
		p.mu.Unlock()
		go p.serve(nl)
	}
	p.SetDown(false)
	return nil
}

// SetDelay delays each new connection by d before it is forwarded.
func (p *TCPProxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// SetJitter delays each chunk sent from a client to the target by a random time in
// [0, max): requests sent on different connections then arrive in another order than
// they were sent, as over a congested or lossy link.
func (p *TCPProxy) SetJitter(max time.Duration) {
	p.mu.Lock()
	p.jitter = max
	p.mu.Unlock()
}

// SetBlackhole makes the link swallow traffic without an answer or an error, as a
// network that drops every packet: new connections are accepted but never reach the
// target, and bytes already in flight, either way, are held. When it lifts, what was held
// goes through late (as TCP retransmits it), unless the endpoints gave up meanwhile.
func (p *TCPProxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hole == nil:
		p.hole = make(chan struct{})
	case !on && p.hole != nil:
		close(p.hole)
		p.hole = nil
	}
}

// through waits while the link is blackholed.
func (p *TCPProxy) through() {
	p.mu.Lock()
	hole := p.hole
	p.mu.Unlock()
	if hole != nil {
		<-hole
	}
}

// SetDown makes the proxy refuse new connections (closed at once) and, when down, cuts every
// open one. SetDown(false) lets traffic through again.
func (p *TCPProxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	var cut []net.Conn
	if down {
		for c := range p.conns {
			cut = append(cut, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
}

// Close stops the proxy and cuts every connection. Idempotent.
func (p *TCPProxy) Close() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
	}
	if p.hold != nil {
		p.hold.Release()
	}
	p.mu.Unlock()
	p.SetDown(true)
	p.SetBlackhole(false)
}

func (p *TCPProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *TCPProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *TCPProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *TCPProxy) handle(client net.Conn) {
	p.mu.Lock()
	delay, down := p.delay, p.down
	p.mu.Unlock()
	if down {
		client.Close()
		return
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	p.through()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client) || !p.track(server) {
		client.Close()
		server.Close()
		return
	}
	defer p.untrack(client)
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst io.WriteCloser, src net.Conn) {
		io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	l := &link{client: client}
	go pipe(jittered{server, p, l}, client)
	go pipe(dropping{client, p, l}, server)
	<-done
	<-done
}

// jittered writes to its connection after the proxy's current jitter.
type jittered struct {
	net.Conn
	p *TCPProxy
	l *link
}

func (j jittered) Write(b []byte) (int, error) {
	j.p.mu.Lock()
	jitter := j.p.jitter
	j.p.mu.Unlock()
	if jitter > 0 {
		time.Sleep(rand.N(jitter))
	}
	if h := j.p.catch(b); h != nil {
		// The whole request is taken off the client now and, once released, sent on a
		// connection of its own: the held connection's side to the target may have been
		// closed as idle meanwhile, and the request must still arrive late, whole.
		req, err := readRequest(b, j.l.client)
		close(h.caught)
		<-h.release
		if err != nil {
			return 0, err
		}
		j.p.deliver(h, req, j.l.client)
		return len(b), nil
	}
	j.p.through()
	return j.Conn.Write(b)
}

// readRequest completes the HTTP/1.1 request that starts in first, reading the rest of its
// head and its Content-Length body from the client, and returns its bytes.
func readRequest(first []byte, client net.Conn) ([]byte, error) {
	req := append([]byte(nil), first...)
	buf := make([]byte, 32<<10)
	more := func() error {
		n, err := client.Read(buf)
		req = append(req, buf[:n]...)
		return err
	}
	end := -1
	for end = bytes.Index(req, []byte("\r\n\r\n")); end < 0; end = bytes.Index(req, []byte("\r\n\r\n")) {
		if err := more(); err != nil {
			return nil, err
		}
	}
	head, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req[:end+4])))
	if err != nil {
		return nil, err
	}
	for int64(len(req)-end-4) < head.ContentLength {
		if err := more(); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// deliver sends a held request to the target on a new connection, signals Answered when
// the target's answer arrives and passes that answer on to the client (who may be gone).
func (p *TCPProxy) deliver(h *Held, req []byte, client net.Conn) {
	p.through()
	conn, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer conn.Close()
	if _, err := conn.Write(req); err != nil {
		return
	}
	var raw bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(conn, &raw)), nil)
	if err != nil {
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h.ansOnce.Do(func() { close(h.answered) })
	client.Write(raw.Bytes())
}

// DropResponses makes the proxy drop the next n answers from the target: the request has
// reached the target (which acts on it), but its answer never reaches the client, whose
// connection is cut instead -- a commit whose response was lost.
func (p *TCPProxy) DropResponses(n int) {
	p.mu.Lock()
	p.drop = n
	p.mu.Unlock()
}

// dropping writes the target's answers to the client unless the proxy is to drop one.
type dropping struct {
	net.Conn
	p *TCPProxy
	l *link
}

func (d dropping) Write(b []byte) (int, error) {
	d.p.mu.Lock()
	drop := d.p.drop > 0
	if drop {
		d.p.drop--
	}
	d.p.mu.Unlock()
	if drop {
		d.Conn.Close()
		return 0, net.ErrClosed
	}
	d.p.through()
	return d.Conn.Write(b)
}
