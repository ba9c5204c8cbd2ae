package harness

import (
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
)

// A port handed to a child process used to be found by listening on port 0 and closing
// the listener: between that close and the child's bind any other process could be given
// the same port (CI saw `bind: address already in use`), and again between a box's exit and
// its restart on the same port. Neither window exists now: FreePort keeps the port bound,
// without listening, until the test ends.
//
// Why that is enough, on Linux: the kernel never picks a port that has a bound socket for a
// bind to port 0 (every other process's listener on ":0", and every net.Listen the other
// tests' helpers make) nor as the local port of an outgoing connection (connect's ephemeral
// ports skip explicitly bound ones), and a socket that only holds the port cannot stop the
// child: the reservation sets SO_REUSEADDR and never listens, and every Go TCP listener
// (lchat-caddy, versitygw, pebble, SeaweedFS, DERP servers) sets SO_REUSEADDR, so the child's
// bind and listen succeed; once it listens, nobody else can. While the child is down, the
// port refuses connections (nothing listens) exactly as a free port would, and a restarted
// box binds the same port again. The reservation is on the IPv6 wildcard with IPV6_V6ONLY
// off (else the IPv4 wildcard), so it holds the port on every loopback address: a child may
// listen on 127.0.0.x:port or on :port (the shipped Caddyfiles listen on all addresses).
//
// UDP: the same port number is held for UDP too, since a box's HTTP/3 listener binds the
// UDP port of its HTTPS address. The UDP reservation sets SO_REUSEPORT and is connected to
// a peer that never sends (127.0.0.1:9): Caddy binds its UDP sockets with SO_REUSEPORT, so
// it binds beside the reservation, and a connected socket in a reuseport group receives
// only from its peer, so every datagram reaches the box; a bind without SO_REUSEPORT (any
// other program's) fails, and the kernel hands the port to no bind on port 0
// (TestFreePortHoldsUDPForHTTP3). StartACME's DNS port (challtestsrv, a UDP server without
// SO_REUSEPORT) is reserved on TCP only (freeAddrTCP), and retries on that child's own
// "address already in use" (see startChallSrv).

// FreePort returns a TCP port reserved for the rest of the test: no other process can be
// given it, while the child the test hands it to (or a restart of that child) can listen on
// it on ip or on any address. ip is the address the caller means to listen on; the port
// is reserved on all of them.
func FreePort(t testing.TB, ip string) string {
	t.Helper()
	port, err := reservePort(t)
	if err != nil {
		t.Fatalf("reserving a port for %s: %v", ip, err)
	}
	return strconv.Itoa(port)
}

// FreeAddr is ip:FreePort(t, ip).
func FreeAddr(t testing.TB, ip string) string {
	t.Helper()
	return net.JoinHostPort(ip, FreePort(t, ip))
}

// reservePort binds a TCP socket to a port the kernel chooses, without listening, and
// keeps it until the test's cleanup.
func reservePort(t testing.TB) (int, error) {
	return reservePortUDP(t, true)
}

// reservePortUDP is reservePort, holding the UDP port of the same number too when udp is
// set (a port already taken for UDP is given back and another chosen).
func reservePortUDP(t testing.TB, udp bool) (int, error) {
	for attempt := 0; ; attempt++ {
		fd, port, err := reserve(syscall.AF_INET6)
		if err != nil {
			// No IPv6 on this machine: the IPv4 wildcard covers every 127.0.0.x.
			fd, port, err = reserve(syscall.AF_INET)
		}
		if err != nil {
			return 0, err
		}
		if !udp {
			t.Cleanup(func() { syscall.Close(fd) })
			return port, nil
		}
		ufd, uerr := reserveUDP(port)
		if uerr == nil {
			t.Cleanup(func() { syscall.Close(fd); syscall.Close(ufd) })
			return port, nil
		}
		syscall.Close(fd)
		if attempt == 20 {
			return 0, fmt.Errorf("no port free for both TCP and UDP: %v", uerr)
		}
	}
}

// reserveUDP holds UDP port for an SO_REUSEPORT server of the same user (Caddy's HTTP/3)
// and no one else: bound on the wildcard with SO_REUSEPORT, connected to a peer that never
// sends, so that it takes no datagram meant for the server.
func reserveUDP(port int) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	v6 := err == nil
	if !v6 {
		if fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0); err != nil {
			return -1, err
		}
	}
	fail := func(op string, err error) (int, error) {
		syscall.Close(fd)
		return -1, fmt.Errorf("udp %s: %v", op, err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, soReusePort, 1); err != nil {
		return fail("SO_REUSEPORT", err)
	}
	var bind, peer syscall.Sockaddr = &syscall.SockaddrInet4{Port: port}, &syscall.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}}
	if v6 {
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0); err != nil {
			return fail("IPV6_V6ONLY", err)
		}
		bind = &syscall.SockaddrInet6{Port: port}
		peer = &syscall.SockaddrInet6{Port: 9, Addr: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}}
	}
	if err := syscall.Bind(fd, bind); err != nil {
		return fail("bind", err)
	}
	if err := syscall.Connect(fd, peer); err != nil {
		return fail("connect", err)
	}
	return fd, nil
}

// soReusePort is SO_REUSEPORT on Linux (the syscall package does not name it).
const soReusePort = 0xf

func reserve(family int) (fd, port int, err error) {
	fd, err = syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("socket: %v", err)
	}
	fail := func(op string, err error) (int, int, error) {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("%s: %v", op, err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		return fail("SO_REUSEADDR", err)
	}
	var sa syscall.Sockaddr = &syscall.SockaddrInet4{}
	if family == syscall.AF_INET6 {
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0); err != nil {
			return fail("IPV6_V6ONLY", err)
		}
		sa = &syscall.SockaddrInet6{}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	switch a := got.(type) {
	case *syscall.SockaddrInet4:
		port = a.Port
	case *syscall.SockaddrInet6:
		port = a.Port
	}
	return fd, port, nil
}

// freeAddrTCP is FreeAddr with the TCP port alone reserved, for a child whose UDP socket
// on the same port sets no SO_REUSEPORT (challtestsrv's DNS server).
func freeAddrTCP(t testing.TB, ip string) string {
	t.Helper()
	port, err := reservePortUDP(t, false)
	if err != nil {
		t.Fatalf("reserving a port for %s: %v", ip, err)
	}
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

// FreePortNum is FreePort as a number, for configs that take the port alone.
func FreePortNum(t testing.TB) int {
	t.Helper()
	port, err := reservePort(t)
	if err != nil {
		t.Fatalf("reserving a port: %v", err)
	}
	return port
}
