// Package held is this box's held connections (docs/connections.md): the client
// WebSockets and resumable event streams the box keeps open while their space sleeps,
// crashes or moves. connhold keeps the sockets and their messages; this package ties
// them to the box: it delivers a connection's events through the request path's one door
// (box.Serve) to wherever the space is awake, relays acknowledgements between boxes
// (notices, wake announcements, the peer API's calls), serves each space's control
// socket, and decides where a held event stream is reopened. It imports no Caddy: the
// glue (modules/lchat) wraps Caddy's reverse proxy around it and decodes its doors.
package held

import (
	"context"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// Config is what New needs.
type Config struct {
	// Box is the box whose spaces' connections are held. Required.
	Box *box.Box
	// StateDir is the box's state directory, where the control sockets live
	// (engine.ControlSocketPath). Required.
	StateDir string
	// Limits bound the held connections (connhold.Limits).
	Limits connhold.Limits
	// Logger receives the logs. Default: a no-op logger.
	Logger *zap.Logger
}

// Conns is this box's held connections. It outlives config reloads with its box.
type Conns struct {
	hub      *connhold.Hub
	box      *box.Box
	stateDir string
	log      *zap.Logger
	// ctx ends at Close: the notices being retried and the background loops stop.
	ctx    context.Context
	cancel context.CancelFunc
	// cancelObs stops hearing the engine (Finish).
	cancelObs func()

	// relay stamps what this box's instances acknowledge for connections other boxes
	// hold (relay.go).
	relay  connhold.Relay
	ptOnce sync.Once
	pt     *box.PeerTransport
	tells  sync.WaitGroup // notices being sent
	// skips is which peers the control calls' fan-out leaves out (control.go).
	skips peerSkips

	providerState // the provider seam (provider.go)

	// mu guards the fields below it.
	mu         sync.Mutex
	clients    map[string]*connhold.EventClient // by host: the link to its instance's socket
	wakes      map[string]chan struct{}         // by host: closed at the space's next wake
	done       bool                             // Close has run
	controls   map[string]*http.Server          // by host: control endpoints (control.go)
	lastCkptOK map[string]bool                  // by host: whether the last checkpoint succeeded (observe)
	awakeAt    map[string]string                // by host: the peer that last announced it awake
	pulling    map[string]int                   // by host: its pull's state (provider.go)
	probed     map[string]time.Time             // by host, delegated: its held streams' last probe (sse.go)

	// announceMu guards announced: the hosts woken here since the last announcement.
	announceMu sync.Mutex
	announced  map[string]struct{}
}

// New holds connections for cfg.Box: it hears the box's engine and, with the mesh, its
// peers, and closes every held connection with 1012 once the process exits
// (box.Box.Exiting).
func New(cfg Config) (*Conns, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("conns")
	b := cfg.Box
	ctx, cancel := context.WithCancel(context.Background())
	c := &Conns{box: b, stateDir: cfg.StateDir, log: log, ctx: ctx, cancel: cancel,
		clients: make(map[string]*connhold.EventClient), wakes: make(map[string]chan struct{}),
		controls: make(map[string]*http.Server), lastCkptOK: make(map[string]bool),
		awakeAt: make(map[string]string), announced: make(map[string]struct{})}
	hub, err := connhold.NewHub(cfg.Limits, c, log)
	if err != nil {
		cancel()
		return nil, err
	}
	c.hub = hub
	// Asked at most once per space until a checkpoint completes (connhold.Hub); off the
	// delivery goroutine, which must not wait for a checkpoint that freezes the instance.
	hub.NeedCheckpoint = func(space string, at connhold.At) {
		safego.Go(nil, log, "checkpoint for held connections", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if at.Box != "" && at.Box != b.Self() {
				c.askCheckpoint(ctx, space, at.Box) // relay.go
				return
			}
			b.Engine().CheckpointNow(ctx, space)
		})
	}
	c.cancelObs = b.Engine().Observe(c.observe)
	safego.Go(nil, log, "conns exit watch", c.watchExit)
	safego.Go(nil, log, "conns delegation watch", c.watchDelegations) // provider.go
	if b.Mesh() != nil {
		safego.Go(nil, log, "conns peer watch", c.watchPeers)
		safego.Go(nil, log, "conns wake announcements", c.announceLoop)
	}
	return c, nil
}

// watchExit closes every held connection with 1012 as soon as the process is exiting,
// so clients reconnect to another box while this one drains its spaces, instead of after
// Caddy's servers stop.
func (c *Conns) watchExit() {
	select {
	case <-c.ctx.Done():
	case <-c.box.Exiting():
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.hub.Shutdown(ctx, connhold.CloseServiceRestart)
	}
}

// exiting reports whether the process is exiting or the connections are closed.
func (c *Conns) exiting() bool {
	select {
	case <-c.box.Exiting():
		return true
	default:
		return c.closed()
	}
}

func (c *Conns) closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// observe hears the engine: a completed checkpoint covers what was acknowledged before it
// began; a crashed instance's uncovered messages go to the next one; a wake reopens the
// resumable event streams waiting for it (sse.go).
func (c *Conns) observe(ev engine.Event) {
	switch ev.Type {
	case engine.EventCheckpoint:
		c.mu.Lock()
		c.lastCkptOK[ev.Host] = ev.Err == ""
		c.mu.Unlock()
		if ev.Err == "" {
			// The engine's own stamp, taken before it read a file: a message
			// acknowledged before it was written before it, and is in the checkpoint.
			started := ev.Started
			c.hub.CheckpointCovered(ev.Host, started)
			if n, entries, ok := c.relay.Checkpointed(ev.Host, started); ok {
				c.tell(n, entries)
			}
		}
	case engine.EventSleep:
		c.dropIdle(ev.Host)
		// A sleep's final checkpoint starts after the instance has exited, so it holds
		// every message the instance acknowledged: when it succeeded, they are saved.
		c.mu.Lock()
		ok := c.lastCkptOK[ev.Host]
		delete(c.lastCkptOK, ev.Host)
		c.mu.Unlock()
		if ok {
			c.hub.CheckpointDone(ev.Host, c.hub.CheckpointStarted(ev.Host))
		}
		if n, entries, told := c.relay.Ended(ev.Host, ok); told {
			c.tell(n, entries)
		}
	case engine.EventCrash:
		c.dropIdle(ev.Host)
		c.hub.InstanceGone(ev.Host)
		if n, entries, ok := c.relay.Ended(ev.Host, false); ok {
			c.tell(n, entries)
		}
	case engine.EventWake:
		if ev.Err == "" {
			c.signalWake(ev.Host)
			c.announce(ev.Host) // to the peers holding its streams (relay.go)
		}
	}
}

// wakeSignal is a channel closed when host's space next finishes a wake here, or a peer
// announces that it woke there.
func (c *Conns) wakeSignal(host string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.wakes[host]
	if ch == nil {
		ch = make(chan struct{})
		c.wakes[host] = ch
	}
	return ch
}

// signalWake closes host's wake signal: its space is awake, here or (announced) at a peer.
func (c *Conns) signalWake(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch := c.wakes[host]; ch != nil {
		close(ch)
		delete(c.wakes, host)
	}
}

// AwakeAtProvider tells the event streams held for host, a space delegated to a
// provider, that it is awake there (a request of it got the provider's answer): those
// held here reopen now rather than at their next probe, and with tellPeers, those the
// fleet's other boxes hold at the next announcement. The provider announces no wake of
// its own; a reopen of a delegated space goes to the provider whatever box an
// announcement names (box.Serve).
func (c *Conns) AwakeAtProvider(host string, tellPeers bool) {
	c.signalWake(host)
	if tellPeers {
		c.announce(host)
	}
}

// Stats are the hub's figures, for the metrics.
func (c *Conns) Stats() connhold.Stats { return c.hub.Stats() }

// Counters are the held connections' figures for the box's status, fleet and console
// (box.Box.SetCounters).
func (c *Conns) Counters() map[string]uint64 {
	st := c.hub.Stats()
	return map[string]uint64{
		"conns_open": uint64(st.Held), "conns_parked": uint64(st.Parked), "conns_streams": uint64(st.Streams),
		"conn_pending_bytes": uint64(st.PendingBytes), "conn_events_delivered": st.Delivered,
		"conn_events_redelivered": st.Redelivered, "conn_events_replayed": st.Replayed,
	}
}

// SpaceConns is the held connections by space, for the box's status and the console
// (box.Box.SetSpaceConns).
func (c *Conns) SpaceConns() map[string]fleetview.Conns {
	st := c.hub.SpaceStats()
	out := make(map[string]fleetview.Conns, len(st))
	for host, s := range st {
		out[host] = fleetview.Conns{Open: s.Open, Parked: s.Parked, Streams: s.Streams, PendingBytes: s.PendingBytes}
	}
	return out
}

// client is the HTTP client of host's instance, dialing socket (the box's own link to the
// instance's socket, one path per host).
func (c *Conns) client(host, socket string) *connhold.EventClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[host]; cl != nil && cl.Socket == socket {
		return cl
	} else if cl != nil {
		cl.CloseIdleConnections()
	}
	cl := &connhold.EventClient{Socket: socket, MaxIdle: 4, HeaderTimeout: 2 * time.Minute}
	c.clients[host] = cl
	return cl
}

// dropIdle closes the connections kept to host's instance, which has ended.
func (c *Conns) dropIdle(host string) {
	c.mu.Lock()
	cl := c.clients[host]
	c.mu.Unlock()
	if cl != nil {
		cl.DropIdle()
	}
}

// Close ends every held connection with 1012 (the box is going away; clients reconnect
// to another box) within a few seconds, and stops the hub and the control endpoints.
// The engine is still heard until Finish, so the box's drain is told to the boxes that
// hold connections of its spaces.
func (c *Conns) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.hub.Shutdown(ctx, connhold.CloseServiceRestart)
	c.mu.Lock()
	c.done = true
	c.closeControlsLocked()
	for _, cl := range c.clients {
		cl.CloseIdleConnections()
	}
	c.mu.Unlock()
}

// Finish stops hearing the engine, once the box has drained (its last sleeps are told
// to the boxes holding their connections), waits a little for those notices to be sent,
// and stops the background loops.
func (c *Conns) Finish() {
	c.cancelObs()
	done := make(chan struct{})
	go func() { c.tells.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.log.Warn("some held-connection notices were not sent before the box closed; those boxes deliver the messages again")
	}
	c.cancel()
}

// Interface guards
var _ connhold.Deliverer = (*Conns)(nil)
