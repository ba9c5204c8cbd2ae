package connhold

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// Hub holds the box's opted-in connections: one per box, shared by every space.
type Hub struct {
	lim  Limits
	d    Deliverer
	log  *zap.Logger
	poll *poller

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// NeedCheckpoint, when set, is called (from a delivery goroutine) when a space's
	// acknowledged messages awaiting a checkpoint pass half a connection's pending caps, so
	// the glue can take a checkpoint before the caps close connections: of the instance at
	// names, which acknowledged the last of them (on this box, or on another: relay.go).
	// Set before use.
	NeedCheckpoint func(space string, at At)

	pendingBytes atomic.Int64 // every connection's pending bytes
	outBytes     atomic.Int64 // every connection's queued outbound bytes
	st           counters

	mu sync.Mutex
	// conns is every connection not yet done, by id.
	conns map[string]*Conn
	// spaces groups them by space, with the space's acknowledgement clock.
	spaces map[string]*spaceConns
	closed bool
}

// spaceConns is one space's connections. Guarded by the Hub's mu.
type spaceConns struct {
	conns map[string]*Conn
	// ackClock stamps acknowledgements in order; a checkpoint's Mark is the clock when it
	// started.
	ackClock uint64
	// askedCheckpoint: NeedCheckpoint was called and no checkpoint has completed since.
	askedCheckpoint bool
}

// NewHub starts a hub delivering events with d.
func NewHub(lim Limits, d Deliverer, log *zap.Logger) (*Hub, error) {
	if log == nil {
		log = zap.NewNop()
	}
	p, err := newPoller()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{lim: lim.withDefaults(), d: d, log: log, poll: p, ctx: ctx, cancel: cancel,
		conns: make(map[string]*Conn), spaces: make(map[string]*spaceConns)}
	h.st.closes = make(map[int]uint64)
	pollDone := make(chan struct{})
	safego.Go(nil, log, "connhold poller", func() {
		defer close(pollDone)
		if err := p.run(ctx, h.readable); err != nil {
			log.Error("connection poller stopped", zap.Error(err))
		}
	})
	h.wg.Go(func() {
		<-pollDone
		p.release()
	})
	return h, nil
}

// Limits is the hub's limits, defaults filled in.
func (h *Hub) Limits() Limits { return h.lim }

// Conn is one held WebSocket connection.
type Conn struct {
	h     *Hub
	id    string
	space string
	nc    net.Conn
	fd    int

	// Registration in the poller; guarded by the poller's mu.
	registered bool
	pollGen    uint32

	// The reader's state: touched only by the one reader goroutine of the moment (the
	// one-shot registration starts at most one at a time).
	rbuf     []byte // bytes read and not yet parsed
	frag     []byte // a fragmented message being reassembled
	fragOp   byte   // its opcode
	fragging bool
	// inBuf is len(rbuf)+len(frag) as counted in the hub's pendingBytes: a client
	// trickling in a large message cannot make the box hold more than its caps. Released
	// by the reader that sees the connection gone, or by abort when none runs (parked).
	inBuf int

	mu                sync.Mutex
	state             connState // written only by setStateLocked
	tags              []string  // replaced, never changed in place
	meta              []byte    // replaced, never changed in place
	autoReq, autoResp string
	parked            bool

	// Client messages for the instance (deliver.go).
	nextSeq   uint64
	pending   []*pendingMsg
	pendBytes int
	// What the acknowledged ones of pending add up to, kept as they change so that an
	// event costs no walk of a backlog that can be MaxPending long: how many, their bytes,
	// the instances that acknowledged them (Event.Prior) and how many each, and scan, an
	// index below which every message is acknowledged (where nextLocked starts).
	ackedN, ackedBytes int
	priors             []priorCount
	scan               int
	delivering         bool
	readerDelivers     bool // the reader owes the delivery run it asked for (read.go)
	closeQueued        bool // the close event is in pending

	// Frames towards the client (write.go).
	outq     [][]byte
	outBytes int // queued or being written: the box's memory for this client
	queued   int // of outBytes, what no write has taken yet, pongs aside: the slow-reader cap's count
	pongAt   int // 1 + the index in outq of the one pong queued; 0: none
	// room is signalled (with mu) when the writer takes the queue or the state changes:
	// a delivery's answer waits on it for the client to catch up.
	room       sync.Cond
	writing    bool
	closeAfter bool // end the socket once outq is written
	closeCode  int  // the code the box closed with (sent or, for a slow reader, meant)
	closeWhy   string
	// cutBy, once set (a slow reader's cut), is when the write in progress and the close
	// frame must be done: the box does not wait WriteTimeout for a client that reads nothing.
	cutBy time.Time
}

// ID is the connection id.
func (c *Conn) ID() string { return c.id }

// Space is the space the connection belongs to.
func (c *Conn) Space() string { return c.space }

// ErrClosed is Adopt's error once the hub is closed.
var ErrClosed = errors.New("connection hub closed")

// Adopt holds nc, a hijacked connection whose WebSocket handshake is complete, for space
// under id; buffered is what the HTTP server had read past the handshake. open is the
// instance's answer to the upgrade: its messages are sent, its tags, metadata and
// auto-response set.
func (h *Hub) Adopt(nc net.Conn, buffered []byte, space, id string, open Reply) (*Conn, error) {
	fd, err := connFD(nc)
	if err != nil {
		return nil, err
	}
	c := &Conn{h: h, id: id, space: space, nc: nc, fd: fd, tags: []string{}}
	c.room.L = &c.mu
	if len(buffered) > 0 {
		c.rbuf = slices.Clone(buffered)
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	if _, dup := h.conns[id]; dup {
		h.mu.Unlock()
		return nil, fmt.Errorf("connection id %s already held", id)
	}
	h.conns[id] = c
	sc := h.spaces[space]
	if sc == nil {
		sc = &spaceConns{conns: make(map[string]*Conn)}
		h.spaces[space] = sc
	}
	sc.conns[id] = c
	h.mu.Unlock()
	h.st.held.Add(1)

	c.mu.Lock()
	c.applyLocked(open)
	c.mu.Unlock()
	c.sendReply(open, false)
	// Read whatever came with the handshake, then park.
	h.startReader(c)
	return c, nil
}

// connFD is the socket fd under nc (a TCP, Unix or TLS connection, under Caddy's
// wrappers that pass every byte through: underPassThrough).
func connFD(nc net.Conn) (int, error) {
	nc = underPassThrough(nc)
	raw := nc
	if tc, ok := nc.(*tls.Conn); ok {
		raw = underPassThrough(tc.NetConn())
	}
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("holding a %T: no file descriptor", raw)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return -1, err
	}
	return fd, nil
}

// readable is the poller's callback: a parked connection has bytes.
func (h *Hub) readable(c *Conn) {
	c.mu.Lock()
	if c.state != stateOpen || !c.parked {
		c.mu.Unlock()
		return
	}
	c.parked = false
	c.mu.Unlock()
	h.st.parked.Add(-1)
	h.startReader(c)
}

func (h *Hub) startReader(c *Conn) {
	h.st.readers.Add(1)
	safego.Go(&h.wg, h.log, "connhold reader", func() {
		defer h.st.readers.Add(-1)
		c.readLoop()
	})
}

// lookup is space's connection id, or nil: another space's id is not found.
func (h *Hub) lookup(space, id string) *Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.conns[id]
	if c == nil || c.space != space {
		return nil
	}
	return c
}

// spaceConnsOf is a snapshot of space's connections.
func (h *Hub) spaceConnsOf(space string) []*Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	sc := h.spaces[space]
	if sc == nil {
		return nil
	}
	out := make([]*Conn, 0, len(sc.conns))
	for _, c := range sc.conns {
		out = append(out, c)
	}
	return out
}

// allConns is every connection not yet done.
func (h *Hub) allConns() []*Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Conn, 0, len(h.conns))
	for _, c := range h.conns {
		out = append(out, c)
	}
	return out
}

// forget removes a done connection.
func (h *Hub) forget(c *Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[c.id] == c {
		delete(h.conns, c.id)
	}
	if sc := h.spaces[c.space]; sc != nil {
		delete(sc.conns, c.id)
		if len(sc.conns) == 0 && sc.ackClock == 0 {
			delete(h.spaces, c.space)
		}
	}
}

// Shutdown closes every client socket with code (CloseServiceRestart for a draining box),
// waits for the close frames to be written or ctx to end, and stops the hub. Pending
// events are not delivered. Idempotent.
func (h *Hub) Shutdown(ctx context.Context, code int) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	all := make([]*Conn, 0, len(h.conns))
	for _, c := range h.conns {
		all = append(all, c)
	}
	h.mu.Unlock()
	for _, c := range all {
		c.closeWith(code, "")
	}
	for _, c := range all {
		c.waitGone(ctx)
	}
	h.cancel()
	for _, c := range all {
		c.abort(CloseAbnormal, "")
	}
	h.poll.close()
	h.wg.Wait()
}
