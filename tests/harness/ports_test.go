package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// takePort binds ip:port the way any other process handed that port would: a plain
// bind(2), as the kernel's own choice for a bind to port 0 or for an outgoing connection
// is made. It returns the bind's error; on success it keeps the socket until the test ends
// (the port is then taken).
func takePort(t *testing.T, ip string, port int) error {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var a [4]byte
	copy(a[:], net.ParseIP(ip).To4())
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: a}); err != nil {
		syscall.Close(fd)
		return err
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return nil
}

// A port FreePort returned cannot be taken by another process in the window before the
// child binds it (the CI failure: `listen tcp :35465: bind: address already in use`), on
// the address asked for, another loopback address or the wildcard; the child itself
// (a Go listener, as every test server is) binds it, on that address or on all of them.
func TestFreePortCannotBeTakenBeforeTheChildBinds(t *testing.T) {
	for _, listenOn := range []string{"127.0.0.1", "0.0.0.0", ""} {
		port, _ := strconv.Atoi(FreePort(t, "127.0.0.1"))
		for _, ip := range []string{"127.0.0.1", "127.0.0.2", "0.0.0.0"} {
			if err := takePort(t, ip, port); !errors.Is(err, syscall.EADDRINUSE) {
				t.Fatalf("another process bound %s:%d, which FreePort returned (err %v)", ip, port, err)
			}
		}
		addr := net.JoinHostPort(listenOn, strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the child could not listen on %s, the port FreePort returned: %v", addr, err)
		}
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("dialing the child on %s: %v", addr, err)
		}
		c.Close()
		ln.Close()
	}
}

// A box killed and started again comes back on its old ports, though other processes try
// to take them while it is down; while down, its port refuses connections as a free port
// does (a test of a dead peer relies on that). Several boxes start at once, while other
// sockets are opened and closed on ports the kernel chooses, and each gets its own ports.
func TestBoxRestartKeepsItsPorts(t *testing.T) {
	const cfg = `{
  "admin": {"listen": "{$LCHAT_TEST_ADMIN}"},
  "apps": {"http": {"servers": {"s": {
    "listen": ["{$LCHAT_TEST_HTTP}"],
    "automatic_https": {"disable": true},
    "routes": [{"handle": [{"handler": "static_response", "body": "up"}]}]
  }}}}
}`
	// Churn: ports the kernel hands out while the boxes start, as other tests' processes
	// would take them.
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() {
		defer churn.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
				ln.Close()
			}
		}
	}()
	t.Cleanup(func() { close(stop); churn.Wait() })
	var mu sync.Mutex
	seen := map[string]bool{}
	t.Run("boxes", func(t *testing.T) {
		for i := range 4 {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				b := StartBox(t, BoxOptions{JSON: cfg})
				mu.Lock()
				for _, a := range []string{b.HTTPAddr, b.AdminAddr} {
					if seen[a] {
						t.Errorf("two boxes were given %s", a)
					}
					seen[a] = true
				}
				mu.Unlock()
				mustAnswer(t, b.HTTPURL)

				before := b.HTTPAddr
				b.Kill()
				for _, a := range []string{b.HTTPAddr, b.AdminAddr} {
					_, p, _ := net.SplitHostPort(a)
					port, _ := strconv.Atoi(p)
					if _, err := net.Dial("tcp", a); !errors.Is(err, syscall.ECONNREFUSED) {
						t.Fatalf("the dead box's %s did not refuse a connection: %v", a, err)
					}
					if err := takePort(t, "127.0.0.1", port); !errors.Is(err, syscall.EADDRINUSE) {
						t.Fatalf("another process took the dead box's port %d (err %v)", port, err)
					}
				}
				b.Start()
				if b.HTTPAddr != before {
					t.Fatalf("restarted on %s, want %s", b.HTTPAddr, before)
				}
				mustAnswer(t, b.HTTPURL)
			})
		}
	})
}

func mustAnswer(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := fmt.Sprintf("%d %s", resp.StatusCode, body); got != "200 up" {
		t.Fatalf("GET %s: %s, want 200 up", url, got)
	}
}

// A box's HTTP/3 listener binds the UDP port of its HTTPS address. FreePort holds that UDP
// port too: another program's bind fails, the kernel hands it to no bind on port 0, and a
// server that binds it as Caddy does (SO_REUSEPORT), on one address or on all, binds beside
// the reservation and receives every datagram sent to it.
func TestFreePortHoldsUDPForHTTP3(t *testing.T) {
	port, _ := strconv.Atoi(FreePort(t, "127.0.0.1"))
	if pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		pc.Close()
		t.Fatalf("another program bound UDP %d while it was reserved", port)
	}
	for range 2000 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		got := pc.LocalAddr().(*net.UDPAddr).Port
		pc.Close()
		if got == port {
			t.Fatalf("the kernel handed out the reserved UDP port %d", port)
		}
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, soReusePort, 1) })
		return serr
	}}
	for _, addr := range []string{fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf(":%d", port)} {
		pc, err := lc.ListenPacket(t.Context(), "udp", addr)
		if err != nil {
			t.Fatalf("a server with SO_REUSEPORT could not bind %s: %v", addr, err)
		}
		const n = 200
		got := make(chan int)
		go func() {
			buf, c := make([]byte, 16), 0
			for c < n {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					break
				}
				c++
			}
			got <- c
		}()
		for range n {
			c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("x"))
			c.Close()
		}
		// Every datagram reaches the server; one the reservation took would leave it waiting.
		go func() { <-t.Context().Done(); pc.Close() }()
		select {
		case c := <-got:
			if c != n {
				t.Fatalf("the server on %s got %d of %d datagrams", addr, c, n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the server on %s did not get every datagram: the reservation took some", addr)
		}
		pc.Close()
	}
}

// TestListenersCounts: Listeners sees a listener appear and go, on IPv4 and IPv6, and
// two SO_REUSEPORT listeners on one port as two (the state right after a Caddy load).
func TestListenersCounts(t *testing.T) {
	port := FreePortNum(t)
	count := func() int {
		t.Helper()
		n, err := Listeners(port)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("reserved, not listening: %d listeners; want 0", n)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, soReusePort, 1) })
		return serr
	}}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	a, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("one listener: counted %d", n)
	}
	b, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("two SO_REUSEPORT listeners: counted %d", n)
	}
	a.Close()
	WaitOldAdminClosed(t, addr, time.Second)
	b.Close()
	if n := count(); n != 0 {
		t.Fatalf("all closed: counted %d", n)
	}
	if c, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(port))); err == nil {
		defer c.Close()
		if n := count(); n != 1 {
			t.Fatalf("IPv6 listener: counted %d", n)
		}
	}
}
