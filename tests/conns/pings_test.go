package conns

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// pingConfig is the ping harness's shape: LCHAT_CONN_PINGS=<connections>,<every>,<for>
// (the long form: 10000,30s,10m); default the short form, 500,1s,10s.
func pingConfig(t *testing.T) (n int, every, dur time.Duration) {
	v := os.Getenv("LCHAT_CONN_PINGS")
	if v == "" {
		return 500, time.Second, 10 * time.Second
	}
	f := strings.Split(v, ",")
	var err1, err2, err3 error
	if len(f) == 3 {
		n, err1 = strconv.Atoi(f[0])
		every, err2 = time.ParseDuration(f[1])
		dur, err3 = time.ParseDuration(f[2])
	}
	if len(f) != 3 || err1 != nil || err2 != nil || err3 != nil || n <= 0 || every <= 0 || dur <= 0 {
		t.Fatalf("LCHAT_CONN_PINGS=%q: want <connections>,<every>,<for>, e.g. 10000,30s,10m", v)
	}
	return n, every, dur
}

// TestHeldPingsCauseNoWakes: N held WebSockets to a sleeping space send protocol pings
// every P for D; the box answers every one and the space is never woken (the engine's wake
// counter does not move). It prints the figures: pings, pongs, the box's RSS.
func TestHeldPingsCauseNoWakes(t *testing.T) {
	n, every, dur := pingConfig(t)
	const host = "pings.example.com"
	b := startKindBox(t, "300ms", nil, host)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Dial N clients, from source addresses spread over 127.0.0.2 .. 127.0.0.11 (source
	// ports), 64 at a time; each reads its welcome.
	conns := make([]net.Conn, n)
	var dialErr atomic.Pointer[error]
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	start := time.Now()
	for i := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := dialRaw(ctx, b.HTTPAddr, host, net.IPv4(127, 0, 0, byte(2+i%10)))
			if err != nil {
				err = fmt.Errorf("client %d: %w", i, err)
				dialErr.CompareAndSwap(nil, &err)
				return
			}
			conns[i] = c
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if e := dialErr.Load(); e != nil {
		t.Fatal(*e)
	}
	dialed := time.Since(start)
	harness.WaitFor(t, 60*time.Second, "the space asleep with its connections held", func() bool {
		st, _ := spaceState(t, b, host)
		return st == "asleep"
	})
	harness.WaitFor(t, 60*time.Second, "every connection parked", func() bool {
		c := counters(t, b)
		return c["conns_open"] == uint64(n) && c["conns_parked"] == uint64(n)
	})
	c0 := counters(t, b)
	const pingMetric = `lchat_conn_events_total{counter="pings"}`
	p0 := metric(t, b, pingMetric)
	rss0 := rssOf(t, b.PID())

	// Each client pings every P, at its own phase, and waits for the pong with its
	// payload.
	var pings, pongs atomic.Uint64
	var pingErr atomic.Pointer[error]
	end := time.Now().Add(dur)
	for i, c := range conns {
		wg.Go(func() {
			phase := time.Duration(rand.Int64N(int64(every)))
			next := time.Now().Add(phase)
			for k := uint64(0); ; k++ {
				if next.After(end) {
					return
				}
				time.Sleep(time.Until(next))
				next = next.Add(every)
				payload := binary.BigEndian.AppendUint64(nil, uint64(i)<<32|k)
				pings.Add(1)
				if err := pingPong(c, payload); err != nil {
					err = fmt.Errorf("client %d ping %d: %w", i, k, err)
					pingErr.CompareAndSwap(nil, &err)
					return
				}
				pongs.Add(1)
			}
		})
	}
	wg.Wait()
	if e := pingErr.Load(); e != nil {
		t.Fatal(*e)
	}
	c1 := counters(t, b)
	p1 := metric(t, b, pingMetric)
	rss1 := rssOf(t, b.PID())
	st, _ := spaceState(t, b, host)
	t.Logf("%d held connections (dialed in %v), a ping each every %v for %v: %d pings, %d pongs; box counted %d pings; "+
		"events delivered %d, wakes caused %d; space %s; conns open %d, parked %d at the end; box RSS %d MiB before, %d MiB after",
		n, dialed.Round(time.Millisecond), every, dur, pings.Load(), pongs.Load(), p1-p0,
		c1["conn_events_delivered"]-c0["conn_events_delivered"], c1["wakes"]-c0["wakes"], st, c1["conns_open"], c1["conns_parked"], rss0>>20, rss1>>20)
	if got := c1["wakes"] - c0["wakes"]; got != 0 {
		t.Errorf("%d wakes while the connections only pinged, want 0", got)
	}
	if st != "asleep" {
		t.Errorf("the space is %s after the pings, want asleep", st)
	}
	if pongs.Load() != pings.Load() || pings.Load() == 0 {
		t.Errorf("%d pings, %d pongs", pings.Load(), pongs.Load())
	}
	if c1["conns_open"] != uint64(n) {
		t.Errorf("conns_open %d, want %d", c1["conns_open"], n)
	}
}

// dialRaw opens a held WebSocket to host through the box at addr from src, and reads the
// instance's welcome (a text frame).
func dialRaw(ctx context.Context, addr, host string, src net.IP) (net.Conn, error) {
	d := ws.Dialer{NetDial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 30 * time.Second}
		return nd.DialContext(ctx, "tcp", addr)
	}, Timeout: 30 * time.Second}
	return readWelcome(d, ctx, "ws://"+host+"/ws")
}

// readWelcome dials url with d and reads the instance's welcome (a text frame).
func readWelcome(d ws.Dialer, ctx context.Context, url string) (net.Conn, error) {
	c, br, _, err := d.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	// The welcome may have come with the handshake's answer, into br.
	var r io.Reader = c
	if br != nil {
		r = br
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	f, err := ws.ReadFrame(r)
	c.SetReadDeadline(time.Time{})
	if err == nil && br != nil && br.Buffered() > 0 {
		err = fmt.Errorf("%d bytes after the welcome", br.Buffered())
	}
	if br != nil {
		ws.PutReader(br)
	}
	if err != nil || f.Header.OpCode != ws.OpText {
		c.Close()
		return nil, fmt.Errorf("reading the welcome: %v (opcode %v)", err, f.Header.OpCode)
	}
	return c, nil
}

// pingPong sends a masked ping and reads frames up to its pong.
func pingPong(c net.Conn, payload []byte) error {
	// MaskFrameInPlace masks the payload it is given: give it a copy.
	if err := ws.WriteFrame(c, ws.MaskFrameInPlace(ws.NewPingFrame(bytes.Clone(payload)))); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	for {
		f, err := ws.ReadFrame(c)
		if err != nil {
			return err
		}
		switch f.Header.OpCode {
		case ws.OpPong:
			if !bytes.Equal(f.Payload, payload) {
				return fmt.Errorf("pong %x for ping %x", f.Payload, payload)
			}
			return nil
		case ws.OpClose:
			return fmt.Errorf("closed by the box: %x", f.Payload)
		}
	}
}

// rssOf is the resident set of process pid, in bytes.
func rssOf(t *testing.T, pid int) uint64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// metric is the value of the metric line that starts with name (its labels included) in
// the box's /metrics.
func metric(t *testing.T, b *harness.Box, name string) uint64 {
	_, body, err := b.Admin("GET", "/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return uint64(f)
		}
	}
	return 0
}
