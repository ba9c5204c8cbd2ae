package conns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gobwas/ws"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// badClientLimits are the connections block of the bad-client tests: small caps, so that
// each is passed quickly.
var badClientLimits = map[string]any{"max_message": 65536, "max_pending": 16, "max_out_bytes": 65536}

// heldClient is a held WebSocket whose messages arrive on a channel.
type heldClient struct {
	c    *websocket.Conn
	id   string
	msgs chan string
	end  chan error // the read error that ended it
}

// dialHeldClient opens a held WebSocket to host (dial: nil, the default), reads its
// welcome and learns its connection id (whoami); with reading false the test reads
// nothing more until it calls startReading.
func dialHeldClient(t *testing.T, ctx context.Context, b *harness.Box, host string, opts *websocket.DialOptions) *heldClient {
	t.Helper()
	if opts == nil {
		opts = &websocket.DialOptions{}
	}
	opts.Host = host
	c, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+"/ws", opts)
	if err != nil {
		t.Fatalf("dialing %s: %v", host, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	c.SetReadLimit(1 << 20)
	hc := &heldClient{c: c, msgs: make(chan string, 4096), end: make(chan error, 1)}
	if _, _, err := c.Read(ctx); err != nil { // the welcome
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("whoami")); err != nil {
		t.Fatal(err)
	}
	_, m, err := c.Read(ctx)
	id, ok := strings.CutPrefix(string(m), "id ")
	if err != nil || !ok {
		t.Fatalf("whoami: %q, %v", m, err)
	}
	hc.id = id
	return hc
}

func (hc *heldClient) startReading(ctx context.Context) {
	go func() {
		for {
			_, m, err := hc.c.Read(ctx)
			if err != nil {
				hc.end <- err
				return
			}
			hc.msgs <- string(m)
		}
	}()
}

// ask sends a message and returns the next message received.
func (hc *heldClient) ask(t *testing.T, ctx context.Context, msg string) string {
	t.Helper()
	if err := hc.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("sending %q: %v", msg, err)
	}
	select {
	case m := <-hc.msgs:
		return m
	case err := <-hc.end:
		t.Fatalf("sending %q: the connection ended: %v", msg, err)
	case <-ctx.Done():
		t.Fatalf("sending %q: no answer", msg)
	}
	return ""
}

// closedWith waits for the connection's end and returns its close code (-1: none).
func (hc *heldClient) closedWith(t *testing.T, ctx context.Context) websocket.StatusCode {
	t.Helper()
	for {
		select {
		case <-hc.msgs:
		case err := <-hc.end:
			return websocket.CloseStatus(err)
		case <-ctx.Done():
			t.Fatal("the connection was not closed")
		}
	}
}

// instanceCloses waits until the instance got a close event for conn and returns its
// code.
func instanceCloses(t *testing.T, b *harness.Box, host, conn string) string {
	t.Helper()
	var code string
	harness.WaitFor(t, 30*time.Second, "the instance's close event for "+conn, func() bool {
		resp, err := b.Client().Get(b.URL(host, "/closes"))
		if err != nil {
			return false
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for l := range strings.SplitSeq(string(raw), "\n") {
			if c, ok := strings.CutPrefix(l, conn+" "); ok {
				code = c
				return true
			}
		}
		return false
	})
	return code
}

// TestBadClientsCloseOnlyTheirConnection: through a real box, a client that passes a
// bound or breaks the protocol is closed with its code, the instance gets that code in
// the close event, and a bystander's connection to the same space keeps working.
func TestBadClientsCloseOnlyTheirConnection(t *testing.T) {
	const host = "bad.example.com"
	b := startKindBox(t, "1m", badClientLimits, host)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bystander := dialHeldClient(t, ctx, b, host, nil)
	bystander.startReading(ctx)
	stillWorks := func(t *testing.T) {
		t.Helper()
		if got := bystander.ask(t, ctx, "whoami"); got != "id "+bystander.id {
			t.Fatalf("the bystander got %q", got)
		}
	}

	t.Run("oversize message 1009", func(t *testing.T) {
		hc := dialHeldClient(t, ctx, b, host, nil)
		hc.startReading(ctx)
		// The box closes on the frame's header: the rest of the write may meet a reset.
		go hc.c.Write(ctx, websocket.MessageText, []byte("apply "+strings.Repeat("x", 70000)))
		if got := hc.closedWith(t, ctx); got != websocket.StatusMessageTooBig {
			t.Errorf("closed with %v, want 1009", got)
		}
		if got := instanceCloses(t, b, host, hc.id); got != "1009" {
			t.Errorf("the instance's close event has code %s, want 1009", got)
		}
		stillWorks(t)
	})

	t.Run("flood past the pending cap 1013", func(t *testing.T) {
		hc := dialHeldClient(t, ctx, b, host, nil)
		hc.startReading(ctx)
		// The instance takes 100 ms a message; 64 sent at once pass the cap of 16.
		for i := range 64 {
			if err := hc.c.Write(ctx, websocket.MessageText, fmt.Appendf(nil, "slow %d", i)); err != nil {
				break // closed by the box meanwhile
			}
		}
		if got := hc.closedWith(t, ctx); got != websocket.StatusTryAgainLater {
			t.Errorf("closed with %v, want 1013", got)
		}
		if got := instanceCloses(t, b, host, hc.id); got != "1013" {
			t.Errorf("the instance's close event has code %s, want 1013", got)
		}
		stillWorks(t)
	})

	t.Run("slow reader 1008", func(t *testing.T) {
		// A client with a small receive buffer that stops reading while the instance
		// sends it up to 64 MiB (more than the sockets' buffers hold): the box's queue
		// towards it passes max_out_bytes (64 KiB).
		small := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
				return serr
			}}
			return d.DialContext(ctx, network, addr)
		}}}
		hc := dialHeldClient(t, ctx, b, host, &websocket.DialOptions{HTTPClient: small})
		if err := hc.c.Write(ctx, websocket.MessageText, []byte("flood 4096 16384")); err != nil {
			t.Fatal(err)
		}
		harness.WaitFor(t, 60*time.Second, "the box to close the slow reader (lchat_conn_closes_total 1008)", func() bool {
			return metric(t, b, `lchat_conn_closes_total{code="1008"}`) >= 1
		})
		hc.startReading(ctx) // the client reads again: what was written, then the close
		if got := hc.closedWith(t, ctx); got != websocket.StatusPolicyViolation {
			t.Errorf("closed with %v, want 1008", got)
		}
		if got := instanceCloses(t, b, host, hc.id); got != "1008" {
			t.Errorf("the instance's close event has code %s, want 1008", got)
		}
		stillWorks(t)
	})

	t.Run("malformed frame 1002", func(t *testing.T) {
		c, err := dialRaw(ctx, b.HTTPAddr, host, net.IPv4(127, 0, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := ws.WriteFrame(c, ws.MaskFrameInPlace(ws.NewTextFrame([]byte("whoami")))); err != nil {
			t.Fatal(err)
		}
		f, err := ws.ReadFrame(c)
		id, ok := strings.CutPrefix(string(f.Payload), "id ")
		if err != nil || !ok {
			t.Fatalf("whoami: %q, %v", f.Payload, err)
		}
		// A client frame without a mask breaks RFC 6455.
		if err := ws.WriteFrame(c, ws.NewTextFrame([]byte("apply unmasked"))); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var code ws.StatusCode
		for {
			f, err := ws.ReadFrame(c)
			if err != nil {
				t.Fatalf("no close frame: %v", err)
			}
			if f.Header.OpCode == ws.OpClose {
				code, _ = ws.ParseCloseFrameData(f.Payload)
				break
			}
		}
		if code != ws.StatusProtocolError {
			t.Errorf("closed with %d, want 1002", code)
		}
		if _, err := ws.ReadFrame(c); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("after the close frame: %v, want the socket ended", err)
		}
		if got := instanceCloses(t, b, host, id); got != "1002" {
			t.Errorf("the instance's close event has code %s, want 1002", got)
		}
		stillWorks(t)
	})
}

// TestControlEndpointRefusesAnotherSpacesConnections: an instance that names another
// space's connection id on its control endpoint is answered 404 (send, close, set), and
// its list holds only its own space's connections; the other space's client is untouched.
// (These kinds run without isolation, every instance as the box's user. The uid check that
// keeps an isolated instance off another space's control socket is
// TestControlEndpointRefusesAnotherSpacesInstance in tests/isolation, with real isolated
// instances, and TestControlEndpointChecksThePeerUID in modules/lchat.)
func TestControlEndpointRefusesAnotherSpacesConnections(t *testing.T) {
	const hostA, hostB = "a.example.com", "b.example.com"
	b := startKindBox(t, "1m", nil, hostA, hostB)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := dialHeldClient(t, ctx, b, hostA, nil)
	bc := dialHeldClient(t, ctx, b, hostB, nil)
	a.startReading(ctx)
	bc.startReading(ctx)
	for _, call := range []string{
		"POST /.lchat/ws/send?conn=" + bc.id,
		"POST /.lchat/ws/close?conn=" + bc.id + "&code=1000",
		"POST /.lchat/ws/set?conn=" + bc.id,
	} {
		if got := a.ask(t, ctx, "ctl "+call); !strings.HasPrefix(got, "404 ") {
			t.Errorf("space A's instance: %s answered %q, want 404", call, got)
		}
	}
	got := a.ask(t, ctx, "ctl GET /.lchat/ws/conns")
	if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, a.id) || strings.Contains(got, bc.id) {
		t.Errorf("space A's list %q: want 200 with its own connection only", got)
	}
	if got := bc.ask(t, ctx, "whoami"); got != "id "+bc.id {
		t.Errorf("space B's client got %q: it was touched", got)
	}
	select {
	case m := <-bc.msgs:
		t.Errorf("space B's client got %q from space A's instance", m)
	default:
	}
}
