package derpswitch

import (
	"context"
	"errors"
	"sync"
	"time"

	"tailscale.com/derp"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
)

// fakeNet is an in-memory set of DERP regions for unit tests of the state machine.
type fakeNet struct {
	mu   sync.Mutex
	down map[int]bool          // connect refused
	hold map[int]chan struct{} // connect blocks until closed
	// pingHold blocks pings until closed; noPong makes pings time out (the region
	// relays packets but does not answer pings).
	pingHold map[int]chan struct{}
	noPong   map[int]bool
	// pingDelay and connectDelay slow a region's pings and connects.
	pingDelay, connectDelay map[int]time.Duration
	// pongHook runs inside a ping that is about to succeed.
	pongHook func(region int)
	conns    []*fakeConn
}

func newFakeNet() *fakeNet {
	return &fakeNet{down: map[int]bool{}, hold: map[int]chan struct{}{}, pingHold: map[int]chan struct{}{}, noPong: map[int]bool{},
		pingDelay: map[int]time.Duration{}, connectDelay: map[int]time.Duration{}}
}

// holdPings blocks every ping to region until release.
func (n *fakeNet) holdPings(region int) (release func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch := make(chan struct{})
	n.pingHold[region] = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			delete(n.pingHold, region)
			n.mu.Unlock()
			close(ch)
		})
	}
}

func (n *fakeNet) setNoPong(region int, v bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.noPong[region] = v
}

// blip drops every open connection to region and refuses new ones until the
// returned restore is called: a flush of the region's connections.
func (n *fakeNet) blip(region int) (restore func()) {
	n.setDown(region, true)
	n.mu.Lock()
	conns := append([]*fakeConn(nil), n.conns...)
	n.mu.Unlock()
	for _, c := range conns {
		if c.region == region {
			c.cut()
		}
	}
	return func() { n.setDown(region, false) }
}

// conn returns the newest connection to region.
func (n *fakeNet) conn(region int) *fakeConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := len(n.conns) - 1; i >= 0; i-- {
		if n.conns[i].region == region {
			return n.conns[i]
		}
	}
	return nil
}

func (n *fakeNet) setDown(region int, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[region] = down
}

func (n *fakeNet) holdConnect(region int) (release func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch := make(chan struct{})
	n.hold[region] = ch
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.hold[region] == ch {
			delete(n.hold, region)
			close(ch)
		}
	}
}

func (n *fakeNet) dial(getRegion func() *tailcfg.DERPRegion) Conn {
	c := &fakeConn{net: n, region: getRegion().RegionID, inbox: make(chan derp.ReceivedMessage, 16),
		closedCh: make(chan struct{}), cutCh: make(chan struct{}, 1)}
	n.mu.Lock()
	n.conns = append(n.conns, c)
	n.mu.Unlock()
	return c
}

// connectsTo counts connections ever made to region.
func (n *fakeNet) connectsTo(region int) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	total := 0
	for _, c := range n.conns {
		c.mu.Lock()
		if c.region == region {
			total += c.gen
		}
		c.mu.Unlock()
	}
	return total
}

type sentPacket struct {
	region int
	dst    key.NodePublic
	data   []byte
}

type fakeConn struct {
	net      *fakeNet
	region   int
	inbox    chan derp.ReceivedMessage
	closedCh chan struct{}
	cutCh    chan struct{}

	mu        sync.Mutex
	connected bool
	closed    bool
	gen       int
	preferred bool
	sent      []sentPacket
}

func (c *fakeConn) Connect(ctx context.Context) error {
	c.net.mu.Lock()
	down, hold, delay := c.net.down[c.region], c.net.hold[c.region], c.net.connectDelay[c.region]
	c.net.mu.Unlock()
	c.mu.Lock()
	already := c.connected
	c.mu.Unlock()
	if !already {
		time.Sleep(delay)
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.closedCh:
			return errors.New("closed")
		}
	}
	if down {
		return errors.New("connection refused")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("closed")
	}
	if !c.connected {
		c.connected = true
		c.gen++
		c.inbox <- derp.ServerInfoMessage{}
	}
	return nil
}

func (c *fakeConn) Ping(ctx context.Context) error {
	c.net.mu.Lock()
	hold, noPong, delay := c.net.pingHold[c.region], c.net.noPong[c.region], c.net.pingDelay[c.region]
	c.net.mu.Unlock()
	time.Sleep(delay)
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if noPong {
		<-ctx.Done()
		return ctx.Err()
	}
	c.mu.Lock()
	ok := c.connected && !c.closed
	c.mu.Unlock()
	c.net.mu.Lock()
	down := c.net.down[c.region]
	c.net.mu.Unlock()
	if !ok || down {
		return errors.New("not connected")
	}
	c.net.mu.Lock()
	hook := c.net.pongHook
	c.net.mu.Unlock()
	if hook != nil {
		hook(c.region)
	}
	return nil
}

func (c *fakeConn) Send(dst key.NodePublic, b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.connected {
		return errors.New("not connected")
	}
	c.sent = append(c.sent, sentPacket{c.region, dst, append([]byte(nil), b...)})
	return nil
}

func (c *fakeConn) SendPong([8]byte) error { return nil }

func (c *fakeConn) NotePreferred(v bool) {
	c.mu.Lock()
	c.preferred = v
	c.mu.Unlock()
}

func (c *fakeConn) RecvDetail() (derp.ReceivedMessage, int, error) {
	if err := c.Connect(context.Background()); err != nil {
		time.Sleep(time.Millisecond)
		return nil, 0, err
	}
	select {
	case m := <-c.inbox:
		c.mu.Lock()
		defer c.mu.Unlock()
		return m, c.gen, nil
	case <-c.closedCh:
		return nil, 0, errors.New("closed")
	case <-c.cutCh:
		return nil, 0, errors.New("connection reset by peer")
	}
}

// cut breaks the connection as a flush would: the pending Recv fails and the next
// one reconnects (when the region accepts).
func (c *fakeConn) cut() {
	c.mu.Lock()
	c.connected = false
	c.mu.Unlock()
	select {
	case c.cutCh <- struct{}{}:
	default:
	}
}

func (c *fakeConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.connected = false
		close(c.closedCh)
	}
	return nil
}

func testMap(ids ...int) *tailcfg.DERPMap {
	m := &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{}}
	for _, id := range ids {
		m.Regions[id] = &tailcfg.DERPRegion{RegionID: id, RegionCode: "r", Nodes: []*tailcfg.DERPNode{{Name: "n", RegionID: id}}}
	}
	return m
}
