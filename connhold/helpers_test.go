package connhold

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gobwas/ws"
)

// fakeApp is the instance side of Deliver: it records every event, fails those fail
// picks, answers with reply, and can be made to block.
type fakeApp struct {
	mu     sync.Mutex
	events []Event
	fail   func(Event) bool
	reply  func(Event) Reply
	gate   chan struct{} // when non-nil, each delivery waits for a receive
	notify chan Event
}

func newFakeApp() *fakeApp { return &fakeApp{notify: make(chan Event, 1024)} }

func (a *fakeApp) Deliver(ctx context.Context, ev Event) (Reply, error) {
	a.mu.Lock()
	gate, fail, reply := a.gate, a.fail, a.reply
	a.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return Reply{}, ctx.Err()
		}
	}
	ev.Payload = append([]byte(nil), ev.Payload...)
	a.mu.Lock()
	a.events = append(a.events, ev)
	a.mu.Unlock()
	select {
	case a.notify <- ev:
	case <-ctx.Done():
		return Reply{}, ctx.Err()
	}
	if fail != nil && fail(ev) {
		return Reply{}, errors.New("instance down")
	}
	if reply != nil {
		return reply(ev), nil
	}
	return Reply{}, nil
}

func (a *fakeApp) all() []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Event(nil), a.events...)
}

// next waits for the next event the app sees.
func (a *fakeApp) next(t *testing.T) Event {
	t.Helper()
	select {
	case ev := <-a.notify:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event reached the instance")
		return Event{}
	}
}

// testBox is a hub behind a real HTTP server (plain or TLS) that holds every upgrade of
// space "s1" (or the space named by the X-Space header), answering the open with open.
type testBox struct {
	hub  *Hub
	app  *fakeApp
	srv  *httptest.Server
	open Reply
	mu   sync.Mutex
	ids  []string
}

func newTestBox(t *testing.T, lim Limits, useTLS bool) *testBox {
	t.Helper()
	app := newFakeApp()
	tb := newTestBoxWith(t, lim, useTLS, app)
	tb.app = app
	return tb
}

// newPostBox is a testBox whose hub delivers as the box does to an awake instance: each
// event POSTed with an EventClient to instance, served on a Unix socket (tb.app is nil).
func newPostBox(t *testing.T, lim Limits, instance http.Handler) *testBox {
	t.Helper()
	return newTestBoxWith(t, lim, false, postDeliverer{&EventClient{Socket: unixInstance(t, instance)}})
}

// newTestBoxWith is a testBox whose hub delivers with d.
func newTestBoxWith(t *testing.T, lim Limits, useTLS bool, d Deliverer) *testBox {
	t.Helper()
	hub, err := NewHub(lim, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBox{hub: hub}
	tb.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		space := r.Header.Get("X-Space")
		if space == "" {
			space = "s1"
		}
		id := NewID()
		// Recorded before the handshake completes: the client may ask for it as soon as
		// it has the 101.
		tb.mu.Lock()
		tb.ids = append(tb.ids, id)
		tb.mu.Unlock()
		if _, err := hub.Accept(w, r, space, id, tb.open, ""); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	if useTLS {
		tb.srv.StartTLS()
	} else {
		tb.srv.Start()
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hub.Shutdown(ctx, CloseServiceRestart)
		tb.srv.Close()
	})
	return tb
}

// lastID is the id of the last connection accepted, once the hub holds it.
func (tb *testBox) lastID() string {
	tb.mu.Lock()
	id := tb.ids[len(tb.ids)-1]
	tb.mu.Unlock()
	for range 5000 {
		tb.hub.mu.Lock()
		c := tb.hub.conns[id]
		tb.hub.mu.Unlock()
		if c != nil {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	return id
}

// dial opens a coder/websocket client connection.
func (tb *testBox) dial(t *testing.T, hdr http.Header) *websocket.Conn {
	t.Helper()
	url := "ws" + strings.TrimPrefix(tb.srv.URL, "http")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: tb.srv.Client(), HTTPHeader: hdr})
	if err != nil {
		t.Fatalf("dialing: %v", err)
	}
	c.SetReadLimit(-1)
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// rawClient is a WebSocket client that writes frames byte by byte as a test wants them,
// malformed ones included.
type rawClient struct {
	nc net.Conn
	br *bufio.Reader
}

func (tb *testBox) dialRaw(t *testing.T) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", tb.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	var k [16]byte
	rand.Read(k[:])
	fmt.Fprintf(nc, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n\r\n", base64.StdEncoding.EncodeToString(k[:]))
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	return &rawClient{nc: nc, br: br}
}

// write sends one frame; masked as a client must, unless unmasked.
func (rc *rawClient) write(t *testing.T, op ws.OpCode, fin bool, payload []byte, unmasked bool) {
	t.Helper()
	h := ws.Header{Fin: fin, OpCode: op, Length: int64(len(payload))}
	p := append([]byte(nil), payload...)
	if !unmasked {
		h.Masked = true
		rand.Read(h.Mask[:])
		ws.Cipher(p, h.Mask, 0)
	}
	if err := ws.WriteHeader(rc.nc, h); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.nc.Write(p); err != nil {
		t.Fatal(err)
	}
}

// read reads one frame from the box.
func (rc *rawClient) read(t *testing.T) (ws.OpCode, []byte) {
	t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := ws.ReadFrame(rc.br)
	if err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	return f.Header.OpCode, f.Payload
}

// readClose reads frames until a close and returns its code.
func (rc *rawClient) readClose(t *testing.T) int {
	t.Helper()
	for {
		op, p := rc.read(t)
		if op == ws.OpClose {
			code, _ := ws.ParseCloseFrameData(p)
			return int(code)
		}
	}
}

// connholdGoroutines counts the goroutines running this package's connection code
// (readers, writers, deliveries), not the poller's one loop.
func connholdGoroutines() int {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		if strings.Contains(g, "connhold.(*Conn)") {
			n++
		}
	}
	return n
}

func readMsg(t *testing.T, c *websocket.Conn) (websocket.MessageType, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("reading: %v", err)
	}
	return typ, string(b)
}

func write(t *testing.T, c *websocket.Conn, s string) {
	t.Helper()
	if err := c.Write(context.Background(), websocket.MessageText, []byte(s)); err != nil {
		t.Fatalf("writing: %v", err)
	}
}

// closeStatusOf reads until the connection ends and returns the close code the box sent.
func closeStatusOf(t *testing.T, c *websocket.Conn) websocket.StatusCode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, _, err := c.Read(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return -1
			}
			return websocket.CloseStatus(err)
		}
	}
}

// unixInstance serves h on a Unix socket as an instance does, and returns the socket.
func unixInstance(tb testing.TB, h http.Handler) string {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "i.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return sock
}

// postDeliverer is the box's awake path without the engine: each event POSTed to the
// instance with an EventClient, its inline answer the reply.
type postDeliverer struct{ ec *EventClient }

func (d postDeliverer) Deliver(ctx context.Context, ev Event) (Reply, error) {
	return PostEvent(ctx, d.ec, "http://s1", ev)
}
