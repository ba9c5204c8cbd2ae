// Package derp tests the derp_switch app against real DERP servers
// (tailscale.com/derp/derpserver) on loopback: several regions, each behind a TCP
// proxy that can delay or refuse new connections, and a peer that measures echo gaps.
package derp

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/derp/derphttp"
	"tailscale.com/derp/derpserver"
	"tailscale.com/net/netmon"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"
)

// region is one real DERP server behind a TCP proxy.
type region struct {
	id     int
	server *derpserver.Server
	http   *httptest.Server
	proxy  *tcpProxy
}

// startRegions starts n DERP regions (ids 1..n) and returns them with a DERP map whose
// nodes point at the proxies.
func startRegions(t testing.TB, n int) ([]*region, *tailcfg.DERPMap) {
	t.Helper()
	var ids []int
	for id := 1; id <= n; id++ {
		ids = append(ids, id)
	}
	return startRegionIDs(t, ids...)
}

// startRegionIDs starts one DERP region per id, in order.
func startRegionIDs(t testing.TB, ids ...int) ([]*region, *tailcfg.DERPMap) {
	t.Helper()
	m := &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{}}
	var regions []*region
	for _, id := range ids {
		s := derpserver.New(key.NewNode(), logger.Discard)
		hs := httptest.NewUnstartedServer(derpserver.Handler(s))
		hs.StartTLS()
		u, _ := url.Parse(hs.URL)
		p := startProxy(t, u.Host)
		t.Cleanup(func() { hs.Close(); s.Close() })
		regions = append(regions, &region{id: id, server: s, http: hs, proxy: p})
		m.Regions[id] = regionDef(id, p.port())
	}
	return regions, m
}

func regionDef(id, port int) *tailcfg.DERPRegion {
	return &tailcfg.DERPRegion{
		RegionID:   id,
		RegionCode: "test" + strconv.Itoa(id),
		Nodes: []*tailcfg.DERPNode{{
			Name:             strconv.Itoa(id) + "a",
			RegionID:         id,
			HostName:         "127.0.0.1",
			IPv4:             "127.0.0.1",
			DERPPort:         port,
			InsecureForTests: true,
		}},
	}
}

// tcpProxy forwards loopback TCP connections to a DERP server. New connections can be
// delayed (standing in for DNS+TCP+TLS on a slow link) or refused (a dead region).
type tcpProxy struct {
	ln       net.Listener
	upstream string
	delay    atomic.Int64 // nanoseconds
	latency  atomic.Int64 // nanoseconds added to every chunk, each way, on open connections
	refuse   atomic.Bool
	accepted atomic.Int64 // connections that reached the server

	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startProxy(t testing.TB, upstream string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetDelay delays every new connection by d before it reaches the server.
func (p *tcpProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetLatency delays every chunk of data by d in each direction on every connection:
// the TCP connect stays fast, the DERP protocol (and its ping/pong) becomes slow.
func (p *tcpProxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Flush drops every open connection and keeps accepting new ones (an edge flush).
func (p *tcpProxy) Flush() { p.SetRefuse(false, true) }

// Blip drops every open connection and refuses new ones for d.
func (p *tcpProxy) Blip(d time.Duration) {
	p.SetRefuse(true, true)
	time.Sleep(d)
	p.SetRefuse(false, false)
}

// SetRefuse makes the proxy close new connections at once; with cut, it also drops
// the open ones (the region's server is down).
func (p *tcpProxy) SetRefuse(refuse, cut bool) {
	p.refuse.Store(refuse)
	if cut {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *tcpProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *tcpProxy) handle(c net.Conn) {
	if p.refuse.Load() {
		c.Close()
		return
	}
	p.track(c, true)
	defer p.track(c, false)
	defer c.Close()
	if d := time.Duration(p.delay.Load()); d > 0 {
		time.Sleep(d)
	}
	if p.refuse.Load() {
		return
	}
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	p.accepted.Add(1)
	p.track(up, true)
	defer p.track(up, false)
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, c); done <- struct{}{} }()
	go func() { p.pipe(c, up); done <- struct{}{} }()
	<-done
}

// pipe copies src to dst, holding each chunk back by the proxy's latency (in order).
func (p *tcpProxy) pipe(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for ch := range q {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(ch.b); err != nil {
				for range q {
				}
				return
			}
		}
	}()
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(p.latency.Load()))}
		}
		if err != nil {
			return
		}
	}
}

func (p *tcpProxy) close() {
	p.ln.Close()
	p.SetRefuse(true, true)
}

// echoPeer is a DERP client connected to every region that sends an echo request to
// the box every interval (into every region, as a peer with a stale netmap would) and
// records when each distinct reply arrives.
type echoPeer struct {
	key     key.NodePrivate
	box     key.NodePublic
	clients []*derphttp.Client
	prefix  string

	mu      sync.Mutex
	seen    map[uint64]bool
	replies []time.Time
	sentAt  map[uint64]time.Time
	rtts    []rttSample
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func startEchoPeer(t testing.TB, m *tailcfg.DERPMap, box key.NodePublic, interval time.Duration) *echoPeer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &echoPeer{key: key.NewNode(), box: box, prefix: "lchat-echo:", seen: map[uint64]bool{},
		sentAt: map[uint64]time.Time{}, cancel: cancel}
	for _, id := range sortedIDs(m) {
		reg := m.Regions[id]
		c := derphttp.NewRegionClient(e.key, logger.Discard, netmon.NewStatic(), func() *tailcfg.DERPRegion { return reg })
		if err := c.Connect(ctx); err != nil {
			t.Fatalf("peer connecting region %d: %v", id, err)
		}
		e.clients = append(e.clients, c)
		e.wg.Add(1)
		go e.recv(c)
	}
	e.wg.Add(1)
	go e.send(ctx, interval)
	t.Cleanup(e.stop)
	return e
}

func sortedIDs(m *tailcfg.DERPMap) []int {
	var ids []int
	for id := range m.Regions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (e *echoPeer) send(ctx context.Context, interval time.Duration) {
	defer e.wg.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var seq uint64
	for {
		seq++
		msg := binary.BigEndian.AppendUint64([]byte(e.prefix), seq)
		e.mu.Lock()
		e.sentAt[seq] = time.Now()
		e.mu.Unlock()
		for _, c := range e.clients {
			c.Send(e.box, msg)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (e *echoPeer) recv(c *derphttp.Client) {
	defer e.wg.Done()
	const replyPrefix = "lchat-echo-reply:"
	for {
		m, err := c.Recv()
		if err != nil {
			if errors.Is(err, derphttp.ErrClientClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p, ok := m.(derp.ReceivedPacket)
		if !ok || len(p.Data) != len(replyPrefix)+8 || string(p.Data[:len(replyPrefix)]) != replyPrefix {
			continue
		}
		seq := binary.BigEndian.Uint64(p.Data[len(replyPrefix):])
		now := time.Now()
		e.mu.Lock()
		if !e.seen[seq] {
			e.seen[seq] = true
			e.replies = append(e.replies, now)
			if at, ok := e.sentAt[seq]; ok {
				e.rtts = append(e.rtts, rttSample{at: now, rtt: now.Sub(at)})
				delete(e.sentAt, seq)
			}
		}
		e.mu.Unlock()
	}
}

func (e *echoPeer) stop() {
	e.cancel()
	for _, c := range e.clients {
		c.Close()
	}
	e.wg.Wait()
}

// rttSample is one echo round trip (peer → a region → the box → its home → peer),
// taken when the reply arrived.
type rttSample struct {
	at  time.Time
	rtt time.Duration
}

// rttsBetween returns the round trips of replies that arrived in [from, to).
func (e *echoPeer) rttsBetween(from, to time.Time) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []time.Duration
	for _, r := range e.rtts {
		if !r.at.Before(from) && r.at.Before(to) {
			out = append(out, r.rtt)
		}
	}
	return out
}

// mark returns the reply count, to measure gaps from this point on.
func (e *echoPeer) mark() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.replies)
}

// count returns how many distinct replies arrived.
func (e *echoPeer) count() int { return e.mark() }

// gaps returns every interval between consecutive replies since mark, plus the time
// since the last reply (a gap still open counts).
func (e *echoPeer) gaps(since int) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []time.Duration
	for i := max(since, 1); i < len(e.replies); i++ {
		out = append(out, e.replies[i].Sub(e.replies[i-1]))
	}
	if n := len(e.replies); n > 0 {
		out = append(out, time.Since(e.replies[n-1]))
	}
	return out
}

func maxGap(g []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range g {
		m = max(m, d)
	}
	return m
}

func countOver(g []time.Duration, limit time.Duration) int {
	n := 0
	for _, d := range g {
		if d > limit {
			n++
		}
	}
	return n
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}
