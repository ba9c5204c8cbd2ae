package connhold

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// TestHeldIdleMemory prints what one held idle WebSocket costs the box: N clients (in a
// child process, so their memory is not counted) connect over TLS from source addresses
// spread over 127.0.0.x, and the box's RSS and Go heap are read after a GC before and
// after. N is 1000 unless LCHAT_CONNHOLD_N says more (100000 needs a RLIMIT_NOFILE hard
// limit above it, raised here when the process may). LCHAT_CONNHOLD_VARIANT=coder holds
// each connection with coder/websocket and a goroutine blocked in Read instead (the
// measurement behind the choice of an own epoll set and gobwas/ws framing).
func TestHeldIdleMemory(t *testing.T) {
	if os.Getenv("LCHAT_CONNHOLD_CLIENT") != "" {
		t.Skip("the client side runs in TestHeldIdleMemoryClient")
	}
	n := 1000
	if v := os.Getenv("LCHAT_CONNHOLD_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("LCHAT_CONNHOLD_N=%q", v)
		}
	}
	if err := raiseNoFile(uint64(n) + 2000); err != nil {
		t.Skipf("raising RLIMIT_NOFILE for %d connections: %v", n, err)
	}
	variant := os.Getenv("LCHAT_CONNHOLD_VARIANT")

	var hub *Hub
	var coderConns atomic.Int64
	var handler http.HandlerFunc
	switch variant {
	case "", "connhold":
		variant = "connhold"
		var err error
		if hub, err = NewHub(Limits{}, newFakeApp(), nil); err != nil {
			t.Fatal(err)
		}
		handler = func(w http.ResponseWriter, r *http.Request) {
			if _, err := hub.Accept(w, r, "s1", NewID(), Reply{}, ""); err != nil {
				http.Error(w, err.Error(), 400)
			}
		}
	case "coder":
		handler = func(w http.ResponseWriter, r *http.Request) {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			coderConns.Add(1)
			for {
				if _, _, err := c.Read(context.Background()); err != nil {
					return
				}
			}
		}
	default:
		t.Fatalf("LCHAT_CONNHOLD_VARIANT=%q: connhold or coder", variant)
	}
	srv := httptest.NewUnstartedServer(handler)
	// TCP keepalive off at both ends (and in the clients): Go's default probes each idle
	// connection every 15 s, and 100,000 loopback connections probed from both ends in the
	// TCG guest of tests/deploy made 11.9 million probes in 27 min, the guest's loopback
	// dropped 2.45 million packets (softnet), and 18,040 connections died of unanswered
	// probes (TCPAbortOnTimeout) before the figure could be read. Keepalive costs no memory;
	// on a real box its probes go to real clients (see docs/connections.md).
	srv.Listener.Close()
	ln, err := (&net.ListenConfig{KeepAlive: -1}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ecdsaCert(t)}}
	srv.StartTLS()
	defer srv.Close()

	held := func() int64 {
		if hub != nil {
			return hub.Stats().Parked
		}
		return coderConns.Load()
	}
	// Warm up: the first connections allocate the server's pools and TLS state.
	runClients(t, srv.Listener.Addr().String(), 50, func() {
		testwait.WaitFor(t, 10*time.Second, "warm-up connections held", func() bool { return held() == 50 })
	})
	testwait.WaitFor(t, 10*time.Second, "warm-up connections gone", func() bool {
		if hub != nil {
			return hub.Stats().Held == 0
		}
		return true
	})
	coderConns.Store(0)
	rss0, heap0, g0 := settle()
	k0 := readKernelMem()
	start := time.Now()
	runClients(t, srv.Listener.Addr().String(), n, func() {
		// Parking lags the clients' last upgrade when the machine is slow (TCG in
		// tests/deploy): allow a millisecond per connection more than waitFor does.
		for deadline := time.Now().Add(10*time.Second + time.Duration(n)*time.Millisecond); held() != int64(n); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				// The hub's figures say where the rest are: open but not parked (a reader
				// still running), closed by the box (and with which code), or never seen.
				var st any = "n/a"
				if hub != nil {
					st = fmt.Sprintf("%+v", hub.Stats())
				}
				k := readKernelMem()
				t.Fatalf("timed out waiting for every connection held: %d of %d; hub: %v; TCP sockets in use %d -> %d; kernel: %s",
					held(), n, st, k0.tcpInUse, k.tcpInUse, k.tcpChange(k0))
			}
		}
		dial := time.Since(start)
		rss1, heap1, g1 := settle()
		t.Logf("variant=%s N=%d (TLS): RSS %+.1f MiB = %.1f KiB per held idle connection; Go heap %.1f KiB per connection; goroutines %d -> %d; connected in %v",
			variant, n, float64(rss1-rss0)/(1<<20), float64(rss1-rss0)/float64(n)/1024,
			float64(heap1-heap0)/float64(n)/1024, g0, g1, dial.Round(time.Millisecond))
		k1 := readKernelMem()
		t.Logf("kernel, both ends of each loopback connection (the clients' sockets are on this kernel too): Slab %+.1f MiB (SUnreclaim %+.1f MiB) = %.1f KiB per connection; TCP buffer pages %d -> %d; TCP sockets in use %d -> %d",
			float64(k1.slab-k0.slab)/(1<<20), float64(k1.sunreclaim-k0.sunreclaim)/(1<<20), float64(k1.slab-k0.slab)/float64(n)/1024,
			k0.tcpMemPages, k1.tcpMemPages, k0.tcpInUse, k1.tcpInUse)
		t.Logf("kernel counters: %s", k1.tcpChange(k0))
		if hub != nil {
			t.Logf("hub: %+v", hub.Stats())
			if got := connholdGoroutines(); got != 0 {
				t.Errorf("%d connection goroutines for %d idle connections", got, n)
			}
		}
	})
	if hub != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hub.Shutdown(ctx, CloseGoingAway)
	}
}

// ecdsaCert is a self-signed P-256 certificate (what Caddy issues by default; the
// handshakes are much cheaper than httptest's RSA key).
func ecdsaCert(t *testing.T) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// settle collects garbage, returns freed memory to the OS, and reads the RSS, the Go
// heap in use and the goroutine count.
func settle() (rss, heap uint64, goroutines int) {
	for range 3 {
		runtime.GC()
		debug.FreeOSMemory()
		time.Sleep(100 * time.Millisecond)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b, _ := os.ReadFile("/proc/self/statm")
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize()), ms.HeapInuse, runtime.NumGoroutine()
}

// kernelMem is what the kernel holds for sockets, read from /proc/meminfo and
// /proc/net/sockstat: machine-wide, so only a quiet machine (the VM of
// tests/deploy/connhold_vm_test.go) gives a clean difference.
type kernelMem struct {
	slab, sunreclaim      int64 // bytes
	tcpInUse, tcpMemPages int64
	// tcp is what the kernel counts of connections it ended or packets it dropped
	// (/proc/net/netstat, /proc/net/snmp, /proc/net/softnet_stat): where connections
	// that vanished without the hub closing them went.
	tcp map[string]int64
}

// tcpCounters are the kernel's counters kernelMem.tcp keeps.
var tcpCounters = []string{"TcpExt:TCPAbortOnTimeout", "TcpExt:TCPAbortOnMemory", "TcpExt:TCPAbortOnData",
	"TcpExt:TCPAbortOnClose", "TcpExt:TCPMemoryPressures", "TcpExt:TCPBacklogDrop", "TcpExt:ListenDrops",
	"TcpExt:ListenOverflows", "TcpExt:TCPKeepAlive", "Tcp:EstabResets", "Tcp:OutRsts", "Tcp:AttemptFails", "softnet:dropped"}

// tcpChange is what changed in the kernel's counters from k0 to k.
func (k kernelMem) tcpChange(k0 kernelMem) string {
	var out []string
	for _, name := range tcpCounters {
		out = append(out, fmt.Sprintf("%s %+d", name, k.tcp[name]-k0.tcp[name]))
	}
	return strings.Join(out, ", ")
}

// readCounters reads the "Name: a b c" / "Name: 1 2 3" line pairs of /proc/net/netstat
// and /proc/net/snmp, and the dropped column of /proc/net/softnet_stat (hex, per CPU).
func readCounters(into map[string]int64) {
	for _, file := range []string{"/proc/net/netstat", "/proc/net/snmp"} {
		b, _ := os.ReadFile(file)
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if len(names) == 0 || len(names) != len(vals) || names[0] != vals[0] {
				continue
			}
			for j := 1; j < len(names); j++ {
				v, _ := strconv.ParseInt(vals[j], 10, 64)
				into[names[0]+names[j]] = v
			}
		}
	}
	b, _ := os.ReadFile("/proc/net/softnet_stat")
	for l := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			v, _ := strconv.ParseInt(f[1], 16, 64)
			into["softnet:dropped"] += v
		}
	}
}

func readKernelMem() kernelMem {
	k := kernelMem{tcp: map[string]int64{}}
	readCounters(k.tcp)
	b, _ := os.ReadFile("/proc/meminfo")
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Slab:":
			k.slab = v << 10
		case "SUnreclaim:":
			k.sunreclaim = v << 10
		}
	}
	b, _ = os.ReadFile("/proc/net/sockstat")
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i += 2 {
			v, _ := strconv.ParseInt(f[i+1], 10, 64)
			switch f[i] {
			case "inuse":
				k.tcpInUse = v
			case "mem":
				k.tcpMemPages = v
			}
		}
	}
	return k
}

func raiseNoFile(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= need {
		return nil
	}
	if lim.Max < need {
		lim.Max = need
	}
	lim.Cur = need
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// runClients starts the child process holding n client connections to addr, calls
// while once they are all connected, and ends the child.
func runClients(t *testing.T, addr string, n int, while func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHeldIdleMemoryClient$", "-test.v")
	cmd.Env = append(os.Environ(), "LCHAT_CONNHOLD_CLIENT="+addr, "LCHAT_CONNHOLD_CLIENT_N="+strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if line == "CLIENTS READY" {
			break
		}
		if strings.HasPrefix(line, "CLIENT ERROR") {
			t.Fatal(line)
		}
	}
	while()
	go func() {
		for sc.Scan() {
		}
	}()
}

// TestHeldIdleMemoryClient is the client side of TestHeldIdleMemory, run in a child
// process: it connects, upgrades, then keeps only the socket's fd (the client's own TLS
// state is dropped without a close_notify, so each client costs its process little),
// until its stdin closes.
func TestHeldIdleMemoryClient(t *testing.T) {
	addr := os.Getenv("LCHAT_CONNHOLD_CLIENT")
	if addr == "" {
		t.Skip("run by TestHeldIdleMemory")
	}
	n, _ := strconv.Atoi(os.Getenv("LCHAT_CONNHOLD_CLIENT_N"))
	var mu sync.Mutex
	var fds []int
	var failed atomic.Value
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				// 127.0.0.2 .. : 20000 source ports per address.
				src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i/20000))}
				fd, err := clientConn(addr, src)
				if err != nil {
					failed.Store(err)
					return
				}
				mu.Lock()
				fds = append(fds, fd)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		fmt.Printf("CLIENT ERROR %v\n", err)
		return
	}
	fmt.Println("CLIENTS READY")
	os.Stdin.Read(make([]byte, 1))
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func clientConn(addr string, src *net.TCPAddr) (int, error) {
	d := &net.Dialer{LocalAddr: src, Timeout: 30 * time.Second, KeepAlive: -1} // see TestHeldIdleMemory
	tc, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return -1, err
	}
	var k [16]byte
	rand.Read(k[:])
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n\r\n", base64.StdEncoding.EncodeToString(k[:]))
	resp, err := http.ReadResponse(bufio.NewReaderSize(tc, 512), nil)
	if err != nil {
		tc.Close()
		return -1, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		tc.Close()
		return -1, fmt.Errorf("status %d", resp.StatusCode)
	}
	raw := tc.NetConn().(*net.TCPConn)
	rc, _ := raw.SyscallConn()
	dup := -1
	rc.Control(func(fd uintptr) { dup, err = unix.Dup(int(fd)) })
	raw.Close()
	return dup, err
}
