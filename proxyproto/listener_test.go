package proxyproto

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	goproxy "github.com/pires/go-proxyproto"
	"golang.org/x/sys/unix"
)

// accept listens on loopback with allow, has dial send each of writes, and returns the
// server's side of the connection.
func accept(t *testing.T, allow string, writes ...[]byte) net.Conn {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	var prefixes []netip.Prefix
	if allow != "" {
		prefixes, err = ParseAllow([]string{allow})
		if err != nil {
			t.Fatal(err)
		}
	}
	l := &Listener{Listener: inner, Allow: prefixes, Timeout: 2 * time.Second}
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	go func() {
		for i, w := range writes {
			if w == nil { // nil closes the client's side
				client.(*net.TCPConn).CloseWrite()
				return
			}
			client.Write(w)
			if i < len(writes)-1 {
				// Let the write land alone, so the server peeks a partial header.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawRead reads from the socket itself, below every wrapper: what a parked connection's
// poller would find there.
func rawRead(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, n)
	got := 0
	for got < n {
		var m int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			m, rerr = unix.Read(int(fd), buf[got:])
			return rerr != unix.EAGAIN
		}); err != nil {
			t.Fatal(err)
		}
		if rerr != nil || m == 0 {
			t.Fatalf("reading the socket: %d %v", m, rerr)
		}
		got += m
	}
	return string(buf)
}

func TestListenerTakesTheClientFromAnAllowedBalancer(t *testing.T) {
	v2 := v2Header(t, "192.0.2.7:51000", "198.51.100.1:443")
	v1 := []byte("PROXY TCP6 2001:db8::7 2001:db8::1 51000 443\r\n")
	for _, tc := range []struct {
		name   string
		writes [][]byte
		want   string // the client address; empty: the socket's own peer
	}{
		{"v2", [][]byte{append(append([]byte(nil), v2...), "hello"...)}, "192.0.2.7:51000"},
		{"v2 split in the fixed part", [][]byte{v2[:7], append(append([]byte(nil), v2[7:]...), "hello"...)}, "192.0.2.7:51000"},
		{"v1 split in the line", [][]byte{v1[:9], v1[9:30], append(append([]byte(nil), v1[30:]...), "hello"...)}, "[2001:db8::7]:51000"},
		{"no header", [][]byte{[]byte("hello")}, ""},
		{"v2 local (a health check)", [][]byte{append(localV2(t), "hello"...)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := accept(t, "127.0.0.1", tc.writes...)
			addr, err := c.(*Conn).Header()
			if err != nil {
				t.Fatal(err)
			}
			got := c.RemoteAddr().String()
			if tc.want == "" {
				if addr != nil || got == "" || got[:10] != "127.0.0.1:" {
					t.Fatalf("RemoteAddr %s (header %v), want the socket's peer", got, addr)
				}
			} else if got != tc.want {
				t.Fatalf("RemoteAddr %s, want %s", got, tc.want)
			}
			// Nothing past the header was read: the socket itself holds the client's bytes.
			if s := rawRead(t, c, 5); s != "hello" {
				t.Fatalf("the socket holds %q after the header, want %q", s, "hello")
			}
		})
	}
}

func localV2(t *testing.T) []byte {
	h := &goproxy.Header{Version: 2, Command: goproxy.LOCAL, TransportProtocol: goproxy.UNSPEC}
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A header from an address not allowed is never read: its bytes are the application's
// (TLS or HTTP then refuse them), and the address stays the socket's.
func TestListenerIgnoresHeadersFromOthers(t *testing.T) {
	v2 := v2Header(t, "192.0.2.7:51000", "198.51.100.1:443")
	c := accept(t, "127.0.0.2/32", v2)
	if _, ok := c.(*Conn); ok {
		t.Fatal("a connection from an address not allowed was wrapped")
	}
	buf := make([]byte, len(v2))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != string(v2) {
		t.Fatalf("read %q, %v; want the header's bytes untouched", buf, err)
	}
}

func TestListenerRefusesAMalformedHeader(t *testing.T) {
	c := accept(t, "127.0.0.0/8", []byte("PROXY TCP4 not-an-address 198.51.100.1 1 2\r\nhello"))
	if _, err := c.Read(make([]byte, 8)); err == nil {
		t.Fatal("a malformed header was accepted")
	}
}

// A client that closes before sending anything: no header, EOF.
func TestListenerNothingSent(t *testing.T) {
	c := accept(t, "127.0.0.1", nil)
	if n, err := c.Read(make([]byte, 8)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("Read = %d, %v; want EOF", n, err)
	}
}

// The server's own read deadline, set before the first Read, still holds after the
// header: a client that sends the header and then nothing cannot hold the read forever.
func TestListenerKeepsTheUsersDeadline(t *testing.T) {
	c := accept(t, "127.0.0.1", v2Header(t, "192.0.2.7:51000", "198.51.100.1:443"))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read after the header = %v, want the deadline set before it", err)
	}
}

func TestParseAllow(t *testing.T) {
	got, err := ParseAllow([]string{"10.0.0.0/16", "192.0.2.7", "::ffff:10.1.2.3", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[1].String() != "192.0.2.7/32" || got[2].String() != "10.1.2.3/32" {
		t.Fatalf("ParseAllow = %v", got)
	}
	for _, bad := range []string{"10.0.0.300", "example.com", "10.0.0.0/33", ""} {
		if _, err := ParseAllow([]string{bad}); err == nil {
			t.Errorf("ParseAllow(%q) accepted", bad)
		}
	}
}
