package conns

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestHeldIdleMemoryThroughTheBox: N idle WebSockets held by a real lchat-caddy process
// behind Caddy's TLS listener (a `tls_connection_policies` server, a certificate of the
// test CA), to a space that opts in and then sleeps. Every connection is held and parked
// and the space sleeps (the assertions); it prints the box's RSS and goroutines per held
// connection, settled after a GC (boxMemory) with one connection open and with all N.
// LCHAT_CONN_BOX_N sets N (default 200; as many as RLIMIT_NOFILE lets the test and the box
// open: 18,000 on the development machine, and 100,000 in the VM of TestHeldConnectionsVM
// with LCHAT_CONNHOLD_VM_VIA=box). The
// clients run in this process (the box's memory is what is read) with no TCP keepalive
// probe during the test at either end: a probe costs no memory, and under TCG the probes
// of 100,000 loopback connections were dropped and aborted connections
// (docs/connections.md).
// LCHAT_CONN_BOX_HEAP=<file> also writes the box's heap profile there, with all N held.
func TestHeldIdleMemoryThroughTheBox(t *testing.T) {
	n := envInt(t, "LCHAT_CONN_BOX_N", 200)
	ca := harness.NewTestCA(t, t.TempDir(), "example.com")
	cfg := kindConfig(t, "1s", nil)
	cfg.CertFile, cfg.KeyFile = ca.CertFile, ca.KeyFile
	// Caddy cannot turn its TCP keepalive off here (a negative keepalive_interval leaves
	// net.ListenConfig.KeepAlive zero, which Go takes as "on, defaults"), so its first
	// probe is put off past the test instead, as an operator lengthens it.
	cfg.Main = map[string]any{"keepalive_idle": "6h", "keepalive_interval": "6h"}
	const host = "idle.example.com"
	b := startBoxOf(t, cfg, host)
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(ca.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("reading the test CA: %v", err)
	}
	tlsCfg := &tls.Config{RootCAs: pool, ServerName: host}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(i int) error {
		c, err := dialHeldTLS(ctx, b.HTTPAddr, host, net.IPv4(127, 0, 0, byte(2+i%10)), tlsCfg)
		if err != nil {
			return fmt.Errorf("client %d: %w", i, err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return nil
	}
	parked := func(k int) func() bool {
		return func() bool {
			st, _ := spaceState(t, b, host)
			c := counters(t, b)
			return st == "asleep" && c["conns_open"] == uint64(k) && c["conns_parked"] == uint64(k)
		}
	}
	// One connection first: it wakes the space and warms the box's pools and TLS
	// session state; the baseline is read once the space sleeps with it held.
	if err := dial(0); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 60*time.Second, "the space asleep with one connection held", parked(1))
	rss0, g0 := boxMemory(t, b)

	var dialErr atomic.Pointer[error]
	var done atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	start := time.Now()
	progress := time.NewTicker(30 * time.Second)
	dialed := make(chan struct{})
	go func() {
		defer progress.Stop()
		for {
			select {
			case <-dialed:
				return
			case <-progress.C:
				t.Logf("%d of %d connected after %v", done.Load(), n, time.Since(start).Round(time.Second))
			}
		}
	}()
	for i := 1; i <= n && dialErr.Load() == nil; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := dial(i); err != nil {
				dialErr.CompareAndSwap(nil, &err)
				return
			}
			done.Add(1)
		})
	}
	wg.Wait()
	close(dialed)
	if e := dialErr.Load(); e != nil {
		t.Fatalf("after %d connected: %v", done.Load(), *e)
	}
	connected := time.Since(start)
	harness.WaitFor(t, 10*time.Minute, fmt.Sprintf("the space asleep with %d connections held and parked", n+1), parked(n+1))
	rss1, g1 := boxMemory(t, b)
	t.Logf("N=%d held idle WebSockets through the box's TLS listener: box RSS %+.1f MiB = %.1f KiB per held idle connection; goroutines %d -> %d; connected in %v",
		n, float64(int64(rss1)-int64(rss0))/(1<<20), float64(int64(rss1)-int64(rss0))/1024/float64(n), g0, g1, connected.Round(time.Second))
	if p := os.Getenv("LCHAT_CONN_BOX_HEAP"); p != "" {
		// Where the heap goes: the box's heap profile (go tool pprof -sample_index=inuse_space).
		_, body, err := b.Admin("GET", "/debug/pprof/heap", nil)
		if err == nil {
			err = os.WriteFile(p, body, 0o644)
		}
		if err != nil {
			t.Errorf("writing the box's heap profile: %v", err)
		}
	}

	// They are held, not merely open: a protocol ping on a sample is answered by the box
	// while the space sleeps.
	mu.Lock()
	sample := conns[:min(len(conns), 50)]
	mu.Unlock()
	for i, c := range sample {
		if err := pingPong(c, []byte{byte(i)}); err != nil {
			t.Fatalf("ping on held connection %d: %v", i, err)
		}
	}
	if st, _ := spaceState(t, b, host); st != "asleep" {
		t.Errorf("the space is %s after the pings, want asleep", st)
	}
}

// boxMemory is the box's RSS and goroutine count once settled: after a GC (which the
// admin API's heap profile runs first, gc=1), the runtime gives freed pages back to the
// kernel over the next seconds (its scavenger), so the RSS is read every 2 s, a GC
// before each read, until two reads are within 1% (at most 30 s). Measured at 10,000
// held: 216 MiB right after the GC, 174-176 MiB from 4 s on.
func boxMemory(t *testing.T, b *harness.Box) (rss uint64, goroutines uint64) {
	t.Helper()
	read := func() uint64 {
		if code, body, err := b.Admin("GET", "/debug/pprof/heap?gc=1", nil); err != nil || code != 200 {
			t.Fatalf("a GC in the box: %d %v %.200s", code, err, body)
		}
		return rssOf(t, b.PID())
	}
	rss = read()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(2 * time.Second)
		prev := rss
		rss = read()
		if d := int64(rss) - int64(prev); d*100 < int64(prev) && -d*100 < int64(prev) {
			break
		}
	}
	return rss, metric(t, b, "go_goroutines")
}

// dialHeldTLS is dialRaw over TLS (wss), with TCP keepalive off.
func dialHeldTLS(ctx context.Context, addr, host string, src net.IP, cfg *tls.Config) (net.Conn, error) {
	d := ws.Dialer{NetDial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 60 * time.Second, KeepAlive: -1}
		return nd.DialContext(ctx, "tcp", addr)
	}, TLSConfig: cfg, Timeout: 60 * time.Second}
	return readWelcome(d, ctx, "wss://"+host+"/ws")
}
