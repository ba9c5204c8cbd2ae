package lchat

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// conns is the glue between the box and connhold: the hub of this box's held WebSocket
// connections, outliving reloads with the box (pooled). It delivers a connection's events
// to its space's instance, waking the space (Deliver), and tells the hub what the engine
// saved (observe).
type conns struct {
	hub      *connhold.Hub
	box      *box.Box
	stateDir string
	log      *zap.Logger
	cancel   func()

	mu         sync.Mutex
	clients    map[string]*connhold.EventClient // by host: the link to its instance's socket
	wakes      map[string]chan struct{}         // by host: closed at the space's next wake
	done       bool                             // close has run
	controls   map[string]*http.Server          // by host: control endpoints (control.go)
	lastCkptOK map[string]bool                  // by host: whether the last checkpoint succeeded (observe)

	// relay stamps what this box's instances acknowledge for connections other boxes
	// hold (connsmesh.go).
	relay  connhold.Relay
	ptOnce sync.Once
	pt     *box.PeerTransport
	tells  sync.WaitGroup // notices being sent

	announceMu sync.Mutex
	announced  map[string]struct{} // hosts woken here since the last announcement
	awakeAt    map[string]string   // by host: the peer that last announced it awake; guarded by mu
}

// wakeSignal is a channel closed when host's space next finishes a wake here, or a peer
// announces that it woke there.
func (c *conns) wakeSignal(host string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.wakes[host]
	if ch == nil {
		ch = make(chan struct{})
		c.wakes[host] = ch
	}
	return ch
}

func (c *conns) closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func newConns(b *box.Box, stateDir string, lim connhold.Limits, log *zap.Logger) (*conns, error) {
	log = log.Named("conns")
	c := &conns{box: b, stateDir: stateDir, log: log, clients: make(map[string]*connhold.EventClient),
		wakes: make(map[string]chan struct{}), controls: make(map[string]*http.Server), lastCkptOK: make(map[string]bool)}
	hub, err := connhold.NewHub(lim, c, log)
	if err != nil {
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
				c.askCheckpoint(ctx, space, at.Box) // connsmesh.go
				return
			}
			b.Engine().CheckpointNow(ctx, space)
		})
	}
	cancelObs := b.Engine().Observe(c.observe)
	stop := make(chan struct{})
	c.cancel = func() { cancelObs(); close(stop) }
	safego.Go(nil, log, "conns exit watch", func() { c.watchExit(stop) })
	if b.Mesh() != nil {
		safego.Go(nil, log, "conns peer watch", func() { c.watchPeers(stop) })
		safego.Go(nil, log, "conns wake announcements", func() { c.announceLoop(stop) })
	}
	return c, nil
}

// watchExit closes every held connection with 1012 as soon as the process is shutting
// down (caddy.Exiting, polled as the box's own drain does), so clients reconnect to
// another box while this one drains its spaces, instead of after Caddy's servers stop.
func (c *conns) watchExit(stop <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if caddy.Exiting() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c.hub.Shutdown(ctx, connhold.CloseServiceRestart)
				cancel()
				return
			}
		}
	}
}

// observe hears the engine: a completed checkpoint covers what was acknowledged before it
// began; a crashed instance's uncovered messages go to the next one; a wake reopens the
// resumable event streams waiting for it (sse.go).
func (c *conns) observe(ev engine.Event) {
	switch ev.Type {
	case engine.EventCheckpoint:
		c.mu.Lock()
		c.lastCkptOK[ev.Host] = ev.Err == ""
		c.mu.Unlock()
		if ev.Err == "" {
			// The engine's own stamp, taken before it read a file: a message
			// acknowledged before it was written before it, and is in the checkpoint.
			// (It once was the end minus the duration, a moment after the real start,
			// with a second taken off: a connection sending more than its cap within a
			// second was closed, and one sending half its cap a second had its space
			// checkpointed back to back.)
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
			c.announce(ev.Host) // to the peers holding its streams (connsmesh.go)
		}
	}
}

// signalWake closes host's wake signal: its space is awake, here or (announced) at a peer.
func (c *conns) signalWake(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch := c.wakes[host]; ch != nil {
		close(ch)
		delete(c.wakes, host)
	}
}

// counters are the held connections' figures for the box's status, fleet and console.
func (c *conns) counters() map[string]uint64 {
	st := c.hub.Stats()
	return map[string]uint64{
		"conns_open": uint64(st.Held), "conns_parked": uint64(st.Parked),
		"conn_pending_bytes": uint64(st.PendingBytes), "conn_events_delivered": st.Delivered,
		"conn_events_redelivered": st.Redelivered, "conn_events_replayed": st.Replayed,
	}
}

// Deliver carries ev through the request path's one door (box.Serve, connsmesh.go's
// eventDoor) to its space's instance: here, waking the space, or on the peer that runs
// it. The delivery is a use of the space like any request, so the space sleeps its idle
// timeout after the last one. An error leaves the event pending.
func (c *conns) Deliver(ctx context.Context, ev connhold.Event) (connhold.Reply, error) {
	d := &eventDoor{c: c, ctx: ctx, ev: ev}
	if err := c.box.Serve(ctx, box.Request{Host: ev.Space}, d); err != nil {
		return connhold.Reply{}, err
	}
	return d.reply, d.err
}

// client is the HTTP client of host's instance, dialing socket (the box's own link to the
// instance's socket, one path per host).
func (c *conns) client(host, socket string) *connhold.EventClient {
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
func (c *conns) dropIdle(host string) {
	c.mu.Lock()
	cl := c.clients[host]
	c.mu.Unlock()
	if cl != nil {
		cl.DropIdle()
	}
}

// finish stops hearing the engine, once the box has drained (its last sleeps are told
// to the boxes holding their connections: connsmesh.go), and waits a little for those
// notices to be sent.
func (c *conns) finish() {
	c.cancel()
	done := make(chan struct{})
	go func() { c.tells.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.log.Warn("some held-connection notices were not sent before the box closed; those boxes deliver the messages again")
	}
}

// close ends every held connection with 1012 (the box is going away; clients reconnect
// to another box) within a few seconds, and stops the hub.
func (c *conns) close() {
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

// maxOpenAnswer bounds the opt-in answer the box reads before the handshake.
const maxOpenAnswer = 1 << 20

// holdWriter stands between Caddy's reverse proxy and the client for a WebSocket upgrade
// request: an instance answer that opts in (connhold.Opted) is kept, not written, so the
// box can complete the handshake itself; any other answer (a 101 and its tunnel included)
// passes through.
type holdWriter struct {
	http.ResponseWriter
	wrote  bool
	held   bool
	status int
	header http.Header
	body   bytes.Buffer
}

func (w *holdWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code) // informational: passed on, not the answer
		return
	}
	w.wrote = true
	if connhold.Opted(code, w.ResponseWriter.Header()) {
		w.held, w.status, w.header = true, code, w.ResponseWriter.Header().Clone()
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *holdWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.held {
		return w.ResponseWriter.Write(b)
	}
	if w.body.Len()+len(b) > maxOpenAnswer {
		return 0, errors.New("opt-in answer too large")
	}
	return w.body.Write(b)
}

// Flush passes on unless the answer is kept.
func (w *holdWriter) Flush() {
	if !w.held {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap lets Caddy's proxy hijack the connection for a tunnel.
func (w *holdWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instanceUpgrade proxies a WebSocket upgrade request to the instance with a fresh
// connection id; if the instance opts in, the box holds the connection (connhold) and the
// request, with its Use, ends at once: a held connection does not keep the space awake.
func (p *proxying) instanceUpgrade(use *engine.Use, cs *conns) error {
	id := connhold.NewID()
	p.r.Header.Set(connhold.ConnIDHeader, id)
	hw := &holdWriter{ResponseWriter: p.w}
	err := p.h.proxy.ServeHTTP(hw, p.r, p.next)
	if !hw.held {
		return err
	}
	return p.hold(hw, id, cs)
}

// Interface guards
var (
	_ connhold.Deliverer = (*conns)(nil)
	_ http.Flusher       = (*holdWriter)(nil)
)
