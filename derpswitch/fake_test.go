package derpswitch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
)

// fakeNet is an in-memory set of DERP regions for unit tests of the state machine.
type fakeNet struct {
	mu    sync.Mutex
	down  map[int]bool          // connect refused
	hold  map[int]chan struct{} // connect blocks until closed
	conns []*fakeConn
}

func newFakeNet() *fakeNet {
	return &fakeNet{down: map[int]bool{}, hold: map[int]chan struct{}{}}
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
	c := &fakeConn{net: n, region: getRegion().RegionID, inbox: make(chan derp.ReceivedMessage, 16), closedCh: make(chan struct{})}
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

	mu        sync.Mutex
	connected bool
	closed    bool
	gen       int
	preferred bool
	sent      []sentPacket
}

func (c *fakeConn) Connect(ctx context.Context) error {
	c.net.mu.Lock()
	down, hold := c.net.down[c.region], c.net.hold[c.region]
	c.net.mu.Unlock()
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
	c.mu.Lock()
	ok := c.connected && !c.closed
	c.mu.Unlock()
	c.net.mu.Lock()
	down := c.net.down[c.region]
	c.net.mu.Unlock()
	if !ok || down {
		return errors.New("not connected")
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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
