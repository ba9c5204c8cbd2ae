package held

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
)

// Held connections across boxes (docs/connections.md, "Across boxes"): the entry box
// holds the client's socket and sends each event through box.Serve to wherever the space
// is awake; the box with the instance stamps each acknowledgement (connhold.Relay) and
// tells the entry box when a checkpoint saved it; an instance's control calls reach the
// connections other boxes hold through the peer API (mesh.PathConns).

// noticeRetries and noticeBackoff are how a notice is retried (mesh.Client.Notify):
// three more tries, after 200 ms, 400 ms and 800 ms.
const noticeRetries = 3

var noticeBackoff = backoff.Curve{First: 200 * time.Millisecond, Max: 800 * time.Millisecond}

// tell sends n to the entry boxes that hold connections of its space, off the engine's
// goroutine.
func (c *Conns) tell(n connhold.Notice, entries []string) {
	ms := c.box.Mesh()
	if ms == nil {
		return
	}
	body, _ := json.Marshal(n)
	for _, entry := range entries {
		if isClientEntry(entry) {
			// A fleet's entry box takes it with its pull (provider.go).
			c.enqueue(n.Space, entry, pullItem{Notice: &n})
			continue
		}
		if entry == c.box.Self() || !ms.Node().IsLiveMember(entry) {
			continue
		}
		safego.Go(&c.tells, c.log, "held-connection notice", func() {
			if err := ms.Client().Notify(c.ctx, entry, mesh.PathConns+"notice", "held-connection notice", body, noticeRetries, noticeBackoff); err != nil {
				c.log.Warn("could not tell a box what became of its connections' messages; it delivers them again",
					zap.String("host", n.Space), zap.String("box", entry), zap.Error(err))
			}
		})
	}
}

// askCheckpoint asks the box named peer for a checkpoint of space, whose instance there
// acknowledged messages of connections held here that pile up (connhold.Hub's
// NeedCheckpoint); the notice that follows its checkpoint frees them.
func (c *Conns) askCheckpoint(ctx context.Context, space, peer string) {
	ms := c.box.Mesh()
	if ms == nil || !ms.Node().IsLiveMember(peer) {
		return
	}
	resp, err := ms.Client().Call(ctx, http.MethodPost, peer, mesh.PathConns+url.PathEscape(space)+"/checkpoint", nil, nil)
	if err != nil {
		c.log.Warn("asking a box for a checkpoint of held connections' messages", zap.String("host", space), zap.String("box", peer), zap.Error(err))
		return
	}
	resp.Body.Close()
}

// announceEvery is how often the hosts woken here are announced to the peers, which
// reopen the event streams they hold for them (sse.go): wakes are batched into one call
// per peer.
const announceEvery = 200 * time.Millisecond

// announce queues host, woken here, for the next announcement.
func (c *Conns) announce(host string) {
	if c.box.Mesh() == nil {
		return
	}
	c.announceMu.Lock()
	c.announced[host] = struct{}{}
	c.announceMu.Unlock()
}

// announcement is the body of POST PathConns+"awake".
type announcement struct {
	At    string   `json:"at"`
	Hosts []string `json:"hosts"`
}

func (c *Conns) announceLoop() {
	t := time.NewTicker(announceEvery)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		c.announceMu.Lock()
		hosts := make([]string, 0, len(c.announced))
		for h := range c.announced {
			hosts = append(hosts, h)
		}
		clear(c.announced)
		c.announceMu.Unlock()
		if len(hosts) == 0 {
			continue
		}
		ms := c.box.Mesh()
		body, _ := json.Marshal(announcement{At: c.box.Self(), Hosts: hosts})
		for _, m := range ms.Membership().Live() {
			if m.Self == c.box.Self() {
				continue
			}
			safego.Go(nil, c.log, "wake announcement", func() {
				ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
				defer cancel()
				resp, err := ms.Client().Call(ctx, http.MethodPost, m.Self, mesh.PathConns+"awake",
					http.Header{"Content-Type": {"application/json"}}, body)
				if err != nil {
					c.log.Debug("announcing wakes", zap.String("peer", m.Self), zap.Error(err))
					return
				}
				resp.Body.Close()
			})
		}
	}
}

// announcedAt is the peer that last announced host's space awake; "" when none did.
func (c *Conns) announcedAt(host string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.awakeAt[host]
}

// notice applies a Notice a peer sent about this box's connections.
func (c *Conns) notice(n connhold.Notice) error {
	at, err := connhold.ParseAt(n.At)
	if err != nil {
		return err
	}
	if n.Gone {
		c.hub.RemoteGone(n.Space, at, n.Covered)
	} else {
		c.hub.RemoteCovered(n.Space, at, n.Covered)
	}
	return nil
}

// watchPeers delivers again what an instance on a box that left the mesh acknowledged
// and no Notice covered (connhold.Hub.BoxGone): that box cannot say what its last
// checkpoint held.
func (c *Conns) watchPeers() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	ms := c.box.Mesh()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		for _, k := range c.hub.RemoteBoxes() {
			if strings.HasPrefix(k[0], providerAtPrefix) {
				// A provider's box: its notices come with the pull, and a new instance
				// there asks for a replay (provider.go).
				continue
			}
			if !ms.Membership().IsLive(k[0], k[1]) {
				if n := c.hub.BoxGone(k[0], k[1]); n > 0 {
					c.log.Info("a box left the mesh with held connections' messages unsaved; delivering them again",
						zap.String("box", k[0]), zap.Int("messages", n))
				}
			}
		}
	}
}

// ServePeer serves the peer API's held-connection calls (mesh.PathConns), behind the mesh
// token: a Notice, a wake announcement, a checkpoint request, or a control call on the
// connections of one host this box holds (never fanned out again). A refused call is a
// *box.Error with its status.
func (c *Conns) ServePeer(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, mesh.PathConns)
	switch rest {
	case "notice":
		if r.Method != http.MethodPost {
			return &box.Error{Status: http.StatusMethodNotAllowed, Err: errors.New("POST a notice")}
		}
		var n connhold.Notice
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&n); err != nil {
			return &box.Error{Status: http.StatusBadRequest, Err: fmt.Errorf("notice: %v", err)}
		}
		if err := c.notice(n); err != nil {
			return &box.Error{Status: http.StatusBadRequest, Err: err}
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	case "awake":
		if r.Method != http.MethodPost {
			return &box.Error{Status: http.StatusMethodNotAllowed, Err: errors.New("POST an announcement")}
		}
		var an announcement
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&an); err != nil || an.At == "" {
			return &box.Error{Status: http.StatusBadRequest, Err: fmt.Errorf("announcement: %v", err)}
		}
		if !c.box.Mesh().Node().IsLiveMember(an.At) {
			return &box.Error{Status: http.StatusBadRequest, Err: errors.New("announcement from a box that is not a live member")}
		}
		for _, h := range an.Hosts {
			if mesh.NormalizeHost(h) != h {
				continue
			}
			// Where it is awake, for the streams held here (sse.go); not a holder
			// hint for requests, which would go stale when the space sleeps there.
			c.mu.Lock()
			c.awakeAt[h] = an.At
			c.mu.Unlock()
			c.signalWake(h)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	host, op, ok := strings.Cut(rest, "/")
	if !ok || host == "" {
		return &box.Error{Status: http.StatusNotFound, Err: errors.New("no such held-connection call")}
	}
	host, err := url.PathUnescape(host)
	if err != nil || mesh.NormalizeHost(host) != host {
		return &box.Error{Status: http.StatusBadRequest, Err: errors.New("bad host in the path")}
	}
	if op == "checkpoint" {
		if r.Method != http.MethodPost {
			return &box.Error{Status: http.StatusMethodNotAllowed, Err: errors.New("POST a checkpoint request")}
		}
		// Off the request: the asking box does not wait for it (its notice will come).
		safego.Go(nil, c.log, "checkpoint for another box's held connections", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c.box.Engine().CheckpointNow(ctx, host)
		})
		w.WriteHeader(http.StatusAccepted)
		return nil
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/.lchat/" + op
	c.hub.ControlHandler(host).ServeHTTP(w, r2)
	return nil
}

// PeerEvent readies an event a peer forwarded (its header h) for a connection it holds,
// for the instance use holds on this box. An event whose connection's earlier
// acknowledgements were made by another instance is a *connhold.ReplayError naming them
// (answered 409 with connhold.ReplayHeader, undelivered); a malformed one a *box.Error
// 400. Otherwise the peer's headers are stripped, and the instance's answer goes through
// the writer returned, in front of w: it stamps a 2xx answer's header with this
// instance, the acknowledgement's mark and what a checkpoint covers.
func (c *Conns) PeerEvent(host string, use *engine.Use, w http.ResponseWriter, h http.Header) (http.ResponseWriter, error) {
	now := c.At(use)
	var prior []connhold.At
	for _, v := range h.Values(connhold.PriorHeader) {
		at, err := connhold.ParseAt(v)
		if err != nil {
			return nil, &box.Error{Status: http.StatusBadRequest, Err: err}
		}
		prior = append(prior, at)
	}
	entry, id := h.Get(connhold.EntryHeader), h.Get(connhold.ConnIDHeader)
	if entry == "" || !connhold.ValidID(id) {
		return nil, &box.Error{Status: http.StatusBadRequest, Err: errors.New("a forwarded event names no entry box or no valid connection")}
	}
	if isClientEntry(entry) {
		// A fleet's entry box holds it: what its instance may send to (fleetconns.go).
		ch := connChange{gone: h.Get(connhold.EventHeader) == string(connhold.KindClose)}
		if tags, meta, err := connhold.ConnHeaders(h); err == nil {
			ch.tags, ch.meta = &tags, &meta
		}
		c.sawConn(host, entry, id, ch)
	}
	if stale := connhold.StaleAt(prior, now); len(stale) > 0 {
		return nil, &connhold.ReplayError{Stale: stale}
	}
	connhold.StripPeerHeaders(h)
	c.touch(host, entry)
	c.EnsureControl(host)
	return &ackWriter{ResponseWriter: w, stamp: func(h http.Header) {
		c.sawConn(host, entry, id, changeOf(h))
		mark, covered := c.relay.Acked(host, now, entry, time.Now())
		h.Set(connhold.AckAtHeader, now.String())
		h.Set(connhold.AckMarkHeader, strconv.FormatUint(mark, 10))
		h.Set(connhold.CoveredHeader, strconv.FormatUint(covered, 10))
	}}, nil
}

// DurableStamp is the gate's Passed hook for the answer to a peer's event (the output gate
// below PeerEvent's writer, Kind.Durability bucket): a 2xx that passed the gate is marked
// durable (connhold.DurableHeader), and the entry box retires the message at once, when
// the log carries all the instance's state, as the cut that the wait made after the
// instance's answer found it.
func DurableStamp(use *engine.Use) func(code int, h http.Header) {
	return func(code int, h http.Header) {
		if code/100 == 2 && use.LogCarriesAll() {
			h.Set(connhold.DurableHeader, "1")
		}
	}
}

// PeerUpgrade readies an upgrade a peer forwarded (its header h) for a client it will
// hold itself (connhold.EntryHeader); a malformed one is a *box.Error 400. held, called
// with the opt-in answer's header once the instance opted in, makes the relay track the
// connection's acknowledgements for that entry box (and, a fleet's entry box, notes the
// connection its instance may send to: fleetconns.go).
func (c *Conns) PeerUpgrade(host string, use *engine.Use, h http.Header) (held func(answer http.Header), err error) {
	entry, id := h.Get(connhold.EntryHeader), h.Get(connhold.ConnIDHeader)
	if !connhold.ValidID(id) {
		return nil, &box.Error{Status: http.StatusBadRequest, Err: errors.New("a forwarded upgrade names no valid connection")}
	}
	connhold.StripPeerHeaders(h)
	c.EnsureControl(host)
	return func(answer http.Header) {
		c.touch(host, entry)
		c.sawConn(host, entry, id, changeOf(answer))
		c.relay.Track(host, c.At(use), entry)
	}, nil
}
