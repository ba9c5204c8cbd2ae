package harness

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Caddy replaces its admin server on every config load, failed ones included: the new
// server listens beside the old one (both bind with SO_REUSEPORT) and the old one closes
// its listener a moment later, in a goroutine (caddy.replaceLocalAdminServer). A
// connection the kernel queued on the old socket in between is reset when it closes (CI
// saw `connect: connection reset by peer` on the admin request right after a load). The
// load is over, for an admin client, once at most one socket listens on the port again
// (one: the new server; none: the new config moved or disabled the admin endpoint):
// WaitOldAdminClosed waits for that.

// WaitOldAdminClosed waits until at most one TCP socket in this network namespace listens
// on addr's port (IPv4 or IPv6, any address), or fails the test after timeout.
func WaitOldAdminClosed(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("WaitOldAdminClosed(%q): %v", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("WaitOldAdminClosed(%q): %v", addr, err)
	}
	var n int
	WaitFor(t, timeout, fmt.Sprintf("at most 1 socket listening on port %d", port), func() bool {
		if n, err = Listeners(port); err != nil {
			t.Fatal(err)
		}
		return n <= 1
	}, func() string { return fmt.Sprintf("%d listen", n) })
}

// Listeners counts the TCP sockets in LISTEN state on port in this network namespace,
// from /proc/net/tcp and /proc/net/tcp6.
func Listeners(port int) (int, error) {
	n := 0
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if os.IsNotExist(err) {
			continue // no IPv6
		}
		if err != nil {
			return 0, err
		}
		c, err := countListen(bufio.NewScanner(f), port)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %v", name, err)
		}
		n += c
	}
	return n, nil
}

// countListen reads /proc/net/tcp lines ("sl local_address rem_address st ...", the
// local address as HEXIP:HEXPORT, st 0A for LISTEN).
func countListen(sc *bufio.Scanner, port int) (int, error) {
	n := 0
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			return 0, fmt.Errorf("local address %q", f[1])
		}
		p, err := strconv.ParseUint(f[1][i+1:], 16, 16)
		if err != nil {
			return 0, fmt.Errorf("local address %q: %v", f[1], err)
		}
		if int(p) == port && f[3] == "0A" {
			n++
		}
	}
	return n, sc.Err()
}
